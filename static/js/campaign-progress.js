/* Keeps a campaign's page current without reloading it: polls the progress JSON and puts
   its server-rendered parts in place (the headline, what is happening now, the counts,
   why deliveries did not arrive, the push services slowed down, the outcome by push
   service, the delivery funnel), so the page and its updates never say different things. It announces only
   what matters (a new status, every tenth of the way) through a polite live region, so a
   screen reader is not talked over. "Pause updates" stops it (WCAG 2.2.2); without
   JavaScript the Refresh link does the same job by hand. */
(function () {
  "use strict";
  var section = document.getElementById("progress");
  if (!section || !window.fetch || section.getAttribute("data-finished") === "true") {
    return;
  }
  var url = section.getAttribute("data-progress-url");
  var EVERY_MS = 5000;
  var live = document.getElementById("progress-live");
  var outcome = document.getElementById("outcome-live");
  var funnel = document.getElementById("funnel-live");
  var announce = document.getElementById("progress-announce");
  var pause = document.getElementById("progress-pause");
  var updated = document.getElementById("progress-updated");
  var status = document.getElementById("campaign-status");
  var controls = document.querySelector("section.controls");
  var timer = null;
  // The page's numbers may be a kept reading (a campaign of millions takes seconds to
  // count): the first question waits until the server may have newer ones.
  var wait = Math.max(
    EVERY_MS, (parseInt(section.getAttribute("data-refresh-after"), 10) || 0) * 1000
  );
  var asking = false;
  var paused = false;
  var shown = { progress: null, outcome: null, funnel: null };
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

  // The fragments are the portal's own templates, escaped by Jinja on the server.
  function place(element, key, html) {
    if (element && shown[key] !== html) {
      element.innerHTML = html;
      shown[key] = html;
    }
  }

  function render(data) {
    place(live, "progress", data.html.progress);
    place(outcome, "outcome", data.html.outcome);
    place(funnel, "funnel", data.html.funnel);
    setText(status, data.statusLabel);
    if (status) { status.className = "tag tag--" + data.tone; }
    var tenth = tenthOf(data.done, data.total);
    // Spoken only on a new status or a new tenth of the way.
    if (data.statusLabel !== lastStatus || tenth !== lastTenth) {
      setText(announce, data.summary);
    }
    lastStatus = data.statusLabel;
    lastTenth = tenth;
    section.setAttribute("data-finished", data.finished ? "true" : "false");
    // The server says when its next answer may differ: a campaign of millions of
    // deliveries costs seconds to read, and its reading is answered again until then.
    wait = Math.max(EVERY_MS, (data.refreshAfter || 0) * 1000);
    setText(updated, "As of " + data.at.slice(11, 19) + " UTC. " + (data.finished
      ? "Finished: no more updates."
      : "Next update in " + Math.round(wait / 1000) + " seconds."));
    if (data.finished) {
      stop();
      pause.hidden = true;
      if (controls) { controls.hidden = true; }  // nothing left to pause or cancel
    }
  }

  // One question at a time: the next is asked once the answer is in (a slow answer
  // never has a second one asked beside it), after the wait the answer gave.
  function poll() {
    timer = null;
    if (paused || asking) { return; }  // an answer awaited schedules the next itself
    if (document.hidden) { start(); return; }
    asking = true;
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok || response.redirected) { throw new Error(String(response.status)); }
        return response.json();
      })
      .then(function (data) {
        asking = false;
        render(data);
        if (!data.finished && !paused) { start(); }
      })
      .catch(function () {
        asking = false;
        stop();
        setText(updated, "Updates stopped: the page could not reach the server. Use Refresh.");
        pause.hidden = true;
      });
  }

  function start() { stop(); timer = window.setTimeout(poll, wait); }
  function stop() { if (timer !== null) { window.clearTimeout(timer); timer = null; } }

  pause.hidden = false;
  pause.addEventListener("click", function () {
    paused = !paused;
    pause.textContent = paused ? "Resume updates" : "Pause updates";
    if (paused) {
      stop();
      setText(updated, "Updates paused.");
    } else {
      poll();  // asks now; the next is timed from its answer
    }
  });
  start();
})();
