/* The campaign form's live preview: as the notification is typed, the preview, the
   payload size and the time to live in words follow. The server renders the same on
   every Preview and Review, and checks the size again; this only saves a round trip.
   No inline script, so the CSP can forbid them. */
(function () {
  "use strict";
  var form = document.getElementById("campaign-form");
  if (!form || !window.TextEncoder || !JSON.stringify) {
    return;
  }
  var field = function (name) { return form.elements.namedItem(name); };
  var byId = function (id) { return document.getElementById(id); };
  var encoder = new TextEncoder();
  // The largest delivery id and a campaign id of the same length as a real one: the
  // server measures the same message (portal.campaigns.services.payload_size).
  var LARGEST_DELIVERY = "9223372036854775807";
  var CAMPAIGN = "00000000-0000-0000-0000-000000000000";
  var UNITS = [["day", 86400], ["hour", 3600], ["minute", 60], ["second", 1]];

  function value(name) {
    var input = field(name);
    return input ? input.value.replace(/\r\n/g, "\n").trim() : "";
  }

  function payloadSize() {
    var message = {
      deliveryId: LARGEST_DELIVERY,
      campaignId: CAMPAIGN,
      title: value("title"),
      body: value("body"),
      tag: "campaign-" + CAMPAIGN
    };
    if (value("url")) { message.url = value("url"); }
    if (value("icon")) { message.icon = value("icon"); }
    if (value("image")) { message.image = value("image"); }
    if (value("badge")) { message.badge = value("badge"); }
    // The buttons as the server counts them: both when the second is filled in, else
    // the first when it is (portal.campaigns.forms.CampaignForm.actions).
    var pairs = [[value("action1_title"), value("action1_url")],
                 [value("action2_title"), value("action2_url")]];
    var filled = function (pair) { return pair[0] || pair[1]; };
    var used = filled(pairs[1]) ? pairs : (filled(pairs[0]) ? pairs.slice(0, 1) : []);
    if (used.length) {
      message.actions = used.map(function (pair, i) {
        return { action: "action-" + (i + 1), title: pair[0], url: pair[1] };
      });
    }
    var checked = function (name) { var box = field(name); return !!(box && box.checked); };
    if (checked("require_interaction")) { message.requireInteraction = true; }
    if (checked("silent")) { message.silent = true; }
    return encoder.encode(JSON.stringify(message)).length;
  }

  function ttlWords(text) {
    if (!/^\d{1,9}$/.test(text)) { return null; }
    var rest = parseInt(text, 10);
    if (rest === 0) { return "0 seconds: delivered only if the browser can be reached at once"; }
    var parts = [];
    UNITS.forEach(function (unit) {
      var amount = Math.floor(rest / unit[1]);
      rest -= amount * unit[1];
      if (amount) { parts.push(amount + " " + unit[0] + (amount === 1 ? "" : "s")); }
    });
    if (parts.length === 1) { return parts[0]; }
    return parts.slice(0, -1).join(", ") + " and " + parts[parts.length - 1];
  }

  function update() {
    var stale = byId("platforms-stale");
    if (stale) { stale.hidden = false; }
    var title = byId("preview-title");
    var body = byId("preview-body");
    var link = byId("preview-link");
    if (title) { title.textContent = value("title") || "Your title appears here"; }
    if (body) { body.textContent = value("body") || "Your message appears here"; }
    if (link) { link.textContent = value("url") || "the site's home page (/)"; }
    var size = byId("preview-size");
    if (size) {
      var limit = parseInt(size.getAttribute("data-limit"), 10);
      var used = payloadSize();
      byId("preview-size-text").textContent = used + " of " + limit + " bytes";
      var over = byId("preview-size-over");
      over.hidden = used <= limit;
      over.textContent = "— too large by " + (used - limit) + " bytes";
    }
    var words = byId("ttl-words");
    if (words) {
      var said = ttlWords(value("ttl"));
      words.textContent = said ? "That is " + said + "." : "Enter whole seconds.";
    }
  }

  form.addEventListener("input", update);
})();
