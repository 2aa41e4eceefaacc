/* Push helpers shared by every page: feature detection, the JSON API, the heartbeat.

   On any page but the subscribe page (which drives them itself), a browser that holds a
   subscription says so to the server at most once an hour and follows its answer:
   "unsubscribe" drops the browser's subscription (erased, revoked or stopped elsewhere),
   "resubscribe" renews it (it expired, or the server does not know it as this browser's
   and the browser belongs to a person it knows).

   The server acts on a subscription only for the browser that holds it: the device
   cookie goes with every call, and the subscription's own auth secret too, for a browser
   whose cookies were cleared. */
(function () {
  "use strict";

  var HEARTBEAT_KEY = "portal.heartbeatAt";
  var PENDING_KEY = "portal.pendingSubscribe";
  var HEARTBEAT_EVERY_MS = 60 * 60 * 1000;

  // localStorage can be missing or throw (storage blocked); the throttle is a courtesy.
  function load(key) {
    try {
      return window.localStorage.getItem(key);
    } catch (_) {
      return null;
    }
  }
  function save(key, value) {
    try {
      if (value === null) {
        window.localStorage.removeItem(key);
      } else {
        window.localStorage.setItem(key, value);
      }
    } catch (_) {
      /* nothing to do: the next page view asks again */
    }
  }

  function supported() {
    return "serviceWorker" in navigator && "PushManager" in window && "Notification" in window;
  }

  function isIOS() {
    var ua = navigator.userAgent || "";
    // iPadOS reports itself as a Mac; touch points give it away.
    return /iPad|iPhone|iPod/.test(ua) || (navigator.platform === "MacIntel" && navigator.maxTouchPoints > 1);
  }

  function standalone() {
    return navigator.standalone === true ||
      (typeof window.matchMedia === "function" && window.matchMedia("(display-mode: standalone)").matches);
  }

  function keyBytes(base64url) {
    var padded = base64url + "===".slice((base64url.length + 3) % 4);
    var raw = window.atob(padded.replace(/-/g, "+").replace(/_/g, "/"));
    var bytes = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i += 1) {
      bytes[i] = raw.charCodeAt(i);
    }
    return bytes;
  }

  function csrfToken() {
    var meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.getAttribute("content") : null;
  }

  /* Resolves {ok, status, data}; rejects only when the network failed. */
  async function postJSON(path, body) {
    var headers = { "Content-Type": "application/json", Accept: "application/json" };
    var token = csrfToken();
    if (token) {
      headers["X-CSRFToken"] = token; // the API is same-origin checked; this is a second lock
    }
    var response = await fetch(path, {
      method: "POST",
      headers: headers,
      body: JSON.stringify(body),
      credentials: "same-origin",
    });
    var data = null;
    try {
      data = await response.json();
    } catch (_) {
      data = null;
    }
    return { ok: response.ok, status: response.status, data: data };
  }

  /* The subscription's auth secret (base64url), or null when the browser gives none. */
  function authOf(subscription) {
    try {
      var keys = subscription.toJSON().keys;
      return keys && typeof keys.auth === "string" && keys.auth ? keys.auth : null;
    } catch (_) {
      return null;
    }
  }

  /* The browser's time zone ("Europe/Paris"), for sending at the person's local hours;
     undefined when the browser does not say (the server then keeps what it had). */
  function timeZone() {
    try {
      var zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
      return typeof zone === "string" && zone ? zone : undefined;
    } catch (_) {
      return undefined;
    }
  }

  /* A body naming the subscription, with the proof that this browser holds it. */
  function naming(subscription, extra) {
    var body = { endpoint: subscription.endpoint };
    var auth = authOf(subscription);
    if (auth) {
      body.auth = auth;
    }
    for (var key in extra || {}) {
      body[key] = extra[key];
    }
    return body;
  }

  async function applicationServerKey() {
    var page = document.getElementById("subscribe-page");
    if (page && page.dataset.vapidPublicKey) {
      return page.dataset.vapidPublicKey;
    }
    var response = await fetch("/api/push/vapid-public-key", { credentials: "same-origin" });
    return (await response.json()).publicKey;
  }

  async function currentSubscription() {
    var registration = await navigator.serviceWorker.getRegistration("/");
    if (!registration) {
      return null;
    }
    return registration.pushManager.getSubscription();
  }

  async function subscribeBrowser(registration) {
    return registration.pushManager.subscribe({
      userVisibleOnly: true,
      applicationServerKey: keyBytes(await applicationServerKey()),
    });
  }

  /* A subscribe POST that has not succeeded yet: if the page closes before it does, the
     next visit finds it and offers to finish or cancel, so nothing stays half-written. */
  function pending() {
    try {
      return JSON.parse(load(PENDING_KEY) || "null");
    } catch (_) {
      return null;
    }
  }
  function setPending(endpoint, body) {
    save(PENDING_KEY, JSON.stringify({ endpoint: endpoint, body: body }));
  }
  function clearPending() {
    save(PENDING_KEY, null);
  }

  function markHeartbeat() {
    save(HEARTBEAT_KEY, String(Date.now()));
  }
  function clearHeartbeat() {
    save(HEARTBEAT_KEY, null);
  }

  /* Resolves the server's answer, or null when skipped (throttled) or unreachable. */
  async function heartbeat(subscription) {
    var last = Number(load(HEARTBEAT_KEY) || 0);
    if (Date.now() - last < HEARTBEAT_EVERY_MS) {
      return null;
    }
    var result;
    try {
      result = await postJSON("/api/push/heartbeat", naming(subscription));
    } catch (_) {
      return null;
    }
    if (!result.ok || !result.data) {
      return null;
    }
    markHeartbeat();
    return result.data;
  }

  /* What the server holds for this browser's subscription, asked now (not throttled):
     resolves {status, action} ("receiving", "stopped", "erased", "expired", "unknown"),
     or null when the server cannot be reached. It counts as the heartbeat. */
  async function status(subscription) {
    var result;
    try {
      result = await postJSON("/api/push/status", naming(subscription));
    } catch (_) {
      return null;
    }
    if (!result.ok || !result.data || typeof result.data.status !== "string") {
      return null;
    }
    markHeartbeat();
    return result.data;
  }

  /* Ask the server now and act on its answer at once: a subscription it stopped, erased
     or does not know is dropped by the browser here, not at the next hourly heartbeat.
     Resolves "none" (no subscription in this browser), "unreachable", or the status the
     browser is left with: "receiving" (renewed if it had expired), "stopped", "erased"
     or "unknown" (the last three with the browser's subscription dropped). */
  async function check(source, policyVersion) {
    var subscription = await currentSubscription();
    if (!subscription) {
      return "none";
    }
    var answer = await status(subscription);
    if (!answer) {
      return "unreachable";
    }
    try {
      if ((await follow(subscription, answer, source, policyVersion)) === "renewed") {
        return "receiving";
      }
    } catch (_) {
      // A renewal the server refused was let go of; a drop that failed changes nothing
      // on the server's side, where the subscription has ended.
      return answer.status === "expired" ? "none" : answer.status;
    }
    return answer.status;
  }

  /* Unsubscribe, subscribe afresh, register the new one.  /* Unsubscribe, subscribe afresh, register the new one. If the server refuses it, the
     browser lets go of it too. Resolves the new subscription. policyVersion: the notice
     the page shows, when it shows one (the grant is recorded against it). */
  async function renew(subscription, source, policyVersion) {
    var registration = await navigator.serviceWorker.ready;
    await subscription.unsubscribe();
    var fresh = await subscribeBrowser(registration);
    var body = { subscription: fresh.toJSON(), source: source || "api", timeZone: timeZone() };
    if (policyVersion) {
      body.policyVersion = policyVersion;
    }
    var result = null;
    try {
      result = await postJSON("/api/push/subscribe", body);
    } catch (_) {
      result = null;
    }
    if (!result || !result.ok) {
      await fresh.unsubscribe();
      throw new Error("the renewed subscription was not registered");
    }
    markHeartbeat();
    return fresh;
  }

  /* Resolves "none", "ended" (the browser let go) or "renewed". */
  async function follow(subscription, answer, source, policyVersion) {
    if (!answer || answer.action === "none") {
      return "none";
    }
    if (answer.action === "unsubscribe") {
      await subscription.unsubscribe();
      clearHeartbeat();
      return "ended";
    }
    if (answer.action === "resubscribe") {
      await renew(subscription, source, policyVersion);
      return "renewed";
    }
    return "none";
  }

  window.PortalPush = {
    supported: supported,
    isIOS: isIOS,
    standalone: standalone,
    keyBytes: keyBytes,
    postJSON: postJSON,
    timeZone: timeZone,
    naming: naming,
    currentSubscription: currentSubscription,
    subscribeBrowser: subscribeBrowser,
    pending: pending,
    setPending: setPending,
    clearPending: clearPending,
    markHeartbeat: markHeartbeat,
    clearHeartbeat: clearHeartbeat,
    heartbeat: heartbeat,
    status: status,
    check: check,
    follow: follow,
  };

  /* A page that shows this device's state (the preference centre, the erasure's answer)
     marks the element that says it with data-device-status; the page's script-less
     wording is the server's, from the device cookie. Here the browser's own subscription
     is asked about now, dropped at once if the server ended it, and the wording follows:
     the element's child with the matching data-device-says is shown, the others hidden. */
  function tell(element, said) {
    element.querySelectorAll("[data-device-says]").forEach(function (part) {
      part.hidden = part.getAttribute("data-device-says") !== said;
    });
    element.setAttribute("data-device-status", said);
    // The devices table's row for this browser says the same, not the server's record.
    if (said === "not-receiving") {
      document.querySelectorAll("[data-this-device-status]").forEach(function (cell) {
        cell.textContent = "Not receiving in this browser";
      });
    }
  }

  async function checkDevice(element) {
    var outcome = await check("api");
    if (outcome === "unreachable") {
      return; // the server's wording stays
    }
    tell(element, outcome === "receiving" ? "receiving" : "not-receiving");
  }

  async function backgroundHeartbeat() {
    if (document.getElementById("subscribe-page") || !supported() || pending()) {
      return;
    }
    var device = document.querySelector("[data-device-status]");
    if (device) {
      await checkDevice(device);
      return;
    }
    var subscription = await currentSubscription();
    if (subscription) {
      await follow(subscription, await heartbeat(subscription), "api");
    }
  }
  backgroundHeartbeat().catch(function () {
    /* a failed heartbeat changes nothing; the next page view tries again */
  });
})();
