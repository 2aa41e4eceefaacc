/* Keeps a campaign's progress current without reloading the page: polls the progress
   JSON, updates the summary, the counts, the bar and the slowed-down push services, and
   announces only what matters (a new status, every tenth of the way) through a polite
   live region, so a screen reader is not talked over. "Pause updates" stops it (WCAG 2.2.2);
   without JavaScript the Refresh link does the same job by hand. */
(function () {
  "use strict";
  var section = document.getElementById("progress");
  if (!section || !window.fetch || section.getAttribute("data-finished") === "true") {
    return;
  }
  var url = section.getAttribute("data-progress-url");
  var EVERY_MS = 5000;
  var summary = document.getElementById("progress-summary");
  var announce = document.getElementById("progress-announce");
  var bar = document.getElementById("progress-bar");
  var pause = document.getElementById("progress-pause");
  var updated = document.getElementById("progress-updated");
  var circuits = document.getElementById("circuits");
  var status = document.getElementById("campaign-status");
  var timer = null;
  var paused = false;
  var number = new Intl.NumberFormat("en");
  // What the page was rendered with: the first poll speaks only if something moved.
  var lastStatus = section.getAttribute("data-status");
  var lastTenth = tenthOf(
    parseInt(section.getAttribute("data-done"), 10),
    parseInt(section.getAttribute("data-total"), 10)
  );

  function tenthOf(done, total) {
    return total ? Math.floor((10 * done) / total) : 0;
  }

  function setText(element, text) {
    if (element && element.textContent !== text) { element.textContent = text; }
  }

  function render(data) {
    Object.keys(data.counts).forEach(function (key) {
      setText(section.querySelector('[data-count="' + key + '"]'), number.format(data.counts[key]));
    });
    setText(section.querySelector('[data-count="total"]'), number.format(data.total));
    bar.max = data.total || 1;
    bar.value = data.done;
    bar.textContent = data.done + " of " + data.total;
    setText(status, data.statusLabel);
    if (status) { status.className = "tag tag--" + data.status; }
    var line = data.summary + (data.finished ? " Refresh the page for the final outcome." : "");
    setText(summary, line);
    var tenth = tenthOf(data.done, data.total);
    // Spoken only on a new status or a new tenth of the way.
    if (data.status !== lastStatus || tenth !== lastTenth) {
      setText(announce, line);
    }
    lastStatus = data.status;
    lastTenth = tenth;
    circuits.textContent = "";
    var items = data.circuits.length ? data.circuits.map(function (c) { return c.text; })
      : ["None: every push service is taking messages."];
    items.forEach(function (text) {
      var li = document.createElement("li");
      li.textContent = text;
      circuits.appendChild(li);
    });
    setText(updated, "As of " + data.at.slice(11, 19) + " UTC, updated every " +
      EVERY_MS / 1000 + " seconds." + (data.finished ? " Finished: no more updates." : ""));
    if (data.finished) { stop(); pause.hidden = true; }
  }

  function poll() {
    if (paused || document.hidden) { return; }
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok || response.redirected) { throw new Error(String(response.status)); }
        return response.json();
      })
      .then(render)
      .catch(function () {
        stop();
        setText(updated, "Updates stopped: the page could not reach the server. Use Refresh.");
        pause.hidden = true;
      });
  }

  function start() { timer = window.setInterval(poll, EVERY_MS); }
  function stop() { if (timer !== null) { window.clearInterval(timer); timer = null; } }

  pause.hidden = false;
  pause.addEventListener("click", function () {
    paused = !paused;
    pause.textContent = paused ? "Resume updates" : "Pause updates";
    if (paused) {
      stop();
      setText(updated, "Updates paused.");
    } else {
      poll();
      start();
    }
  });
  start();
})();
