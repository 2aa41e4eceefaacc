/* The Test devices page: register this browser to receive campaign tests.

   The button asks for permission to show notifications, registers the service worker
   (/sw.js, scope "/"), takes this browser's push subscription (the one it has, else a
   new one with the portal's VAPID key) and posts it with the form, which the server
   checks as it checks any subscription. Without JavaScript the form posts no
   subscription and the server says so. */
(function () {
  "use strict";

  var form = document.getElementById("register-device");
  if (!form) {
    return;
  }
  var field = document.getElementById("device-subscription");
  var status = document.getElementById("register-status");
  var button = document.getElementById("register-button");

  function say(text) {
    status.textContent = text;
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

  async function subscription() {
    if (!("serviceWorker" in navigator) || !("PushManager" in window) || !("Notification" in window)) {
      throw new Error("This browser cannot receive push notifications, so it cannot be a test device.");
    }
    var permission = await Notification.requestPermission();
    if (permission !== "granted") {
      throw new Error(
        "Notifications are blocked for this site in this browser: allow them in the browser's site settings, then try again."
      );
    }
    await navigator.serviceWorker.register("/sw.js", { scope: "/" });
    var registration = await navigator.serviceWorker.ready;
    var existing = await registration.pushManager.getSubscription();
    if (existing) {
      return existing;
    }
    var response = await fetch("/api/push/vapid-public-key", { credentials: "same-origin" });
    if (!response.ok) {
      throw new Error("The portal's push key could not be read: try again in a moment.");
    }
    var key = (await response.json()).publicKey;
    return registration.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: keyBytes(key) });
  }

  /* Marks the row of this browser, when it is one of the devices listed: its push
     subscription's endpoint hashes (SHA-256) to the row's. Asks nothing of the person:
     only a browser that already allowed notifications is looked at. */
  async function markThisBrowser() {
    if (!window.crypto || !window.crypto.subtle || !("serviceWorker" in navigator)) {
      return;
    }
    if (!("Notification" in window) || Notification.permission !== "granted") {
      return;
    }
    var registration = await navigator.serviceWorker.getRegistration("/");
    var found = registration ? await registration.pushManager.getSubscription() : null;
    if (!found) {
      return;
    }
    var digest = await window.crypto.subtle.digest("SHA-256", new TextEncoder().encode(found.endpoint));
    var hex = Array.prototype.map
      .call(new Uint8Array(digest), function (b) {
        return ("0" + b.toString(16)).slice(-2);
      })
      .join("");
    var rows = document.querySelectorAll("tr[data-endpoint-sha256]");
    for (var i = 0; i < rows.length; i += 1) {
      if (rows[i].getAttribute("data-endpoint-sha256") === hex) {
        rows[i].querySelector("[data-this-browser]").hidden = false;
      }
    }
  }
  markThisBrowser().catch(function () {
    /* only a label: nothing to do */
  });

  form.addEventListener("submit", function (event) {
    if (field.value) {
      return; // filled in below: this is the real submission
    }
    event.preventDefault();
    button.disabled = true;
    say("Asking this browser for permission to show notifications…");
    subscription()
      .then(function (found) {
        field.value = JSON.stringify(found.toJSON());
        say("Registering this browser…");
        form.submit();
      })
      .catch(function (error) {
        button.disabled = false;
        say(error && error.message ? error.message : "This browser could not be registered: try again.");
      });
  });
})();
