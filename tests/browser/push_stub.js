/* Test double for the push service, which headless Chromium cannot reach.

   pushManager.subscribe() answers with the subscription the test holds (a real P-256 key
   pair and auth secret made in Python); getSubscription() and unsubscribe() follow it.
   The state lives in localStorage so it survives reloads like a real subscription. Every
   call is logged for the test to read. Everything else (the service worker, the
   permission prompt, the page, the server) is real. */
(function () {
  "use strict";
  var SUBSCRIPTION = __SUBSCRIPTION__;
  var STATE = "__pushStub.subscribed";
  var LOG = "__pushStub.log";
  if (typeof PushManager === "undefined" || typeof localStorage === "undefined") {
    return;
  }
  try {
    localStorage.getItem(STATE);
  } catch (_) {
    return; // an opaque origin (about:blank): nothing to stub
  }

  function log(entry) {
    var list = JSON.parse(localStorage.getItem(LOG) || "[]");
    list.push(entry);
    localStorage.setItem(LOG, JSON.stringify(list));
  }

  function b64url(bytes) {
    var text = "";
    for (var i = 0; i < bytes.length; i += 1) {
      text += String.fromCharCode(bytes[i]);
    }
    return btoa(text).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function keyText(key) {
    if (key === undefined || key === null) {
      return null;
    }
    if (typeof key === "string") {
      return key;
    }
    if (key instanceof ArrayBuffer) {
      return b64url(new Uint8Array(key));
    }
    return b64url(new Uint8Array(key.buffer, key.byteOffset, key.byteLength));
  }

  function make(options) {
    return {
      endpoint: SUBSCRIPTION.endpoint,
      expirationTime: SUBSCRIPTION.expirationTime,
      options: options,
      toJSON: function () {
        return JSON.parse(JSON.stringify(SUBSCRIPTION));
      },
      unsubscribe: function () {
        localStorage.removeItem(STATE);
        log({ call: "unsubscribe", endpoint: SUBSCRIPTION.endpoint });
        return Promise.resolve(true);
      },
    };
  }

  PushManager.prototype.subscribe = function (options) {
    if (Notification.permission !== "granted") {
      return Promise.reject(new DOMException("Registration failed - permission denied", "NotAllowedError"));
    }
    var stored = {
      userVisibleOnly: Boolean(options && options.userVisibleOnly),
      applicationServerKey: keyText(options && options.applicationServerKey),
    };
    localStorage.setItem(STATE, JSON.stringify(stored));
    log({ call: "subscribe", options: stored });
    return Promise.resolve(make(stored));
  };

  PushManager.prototype.getSubscription = function () {
    var stored = localStorage.getItem(STATE);
    return Promise.resolve(stored ? make(JSON.parse(stored)) : null);
  };

  // Count permission prompts: the page may ask only after the button is pressed.
  var request = Notification.requestPermission.bind(Notification);
  Notification.requestPermission = function (callback) {
    log({ call: "requestPermission" });
    return request(callback);
  };
})();
