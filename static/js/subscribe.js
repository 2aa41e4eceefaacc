/* The subscribe page: asks for permission only after the button is pressed, subscribes,
   registers the subscription with the chosen topics, and shows one outcome at a time.
   Every state it can show is already in the page (templates/index.html), hidden. */
(function () {
  "use strict";

  var page = document.getElementById("subscribe-page");
  var push = window.PortalPush;
  if (!page || !push) {
    return;
  }
  var form = document.getElementById("subscribe-form");
  var actions = document.getElementById("subscribe-actions");
  var button = document.getElementById("subscribe-button");
  var progress = document.getElementById("subscribe-progress");
  var baseTitle = document.title;
  var busy = false;
  var unsent = null; // {subscription, body}: subscribed in the browser, not yet registered

  function show(id, options) {
    var focus = options && options.focus;
    var formVisible = options && options.form;
    var shown = null;
    page.querySelectorAll("[data-state]").forEach(function (panel) {
      panel.hidden = panel.id !== id;
      if (panel.id === id) {
        shown = panel;
      }
    });
    form.hidden = !formVisible;
    progress.textContent = "";
    document.title = shown && shown.hasAttribute("data-error") ? "Error: " + baseTitle : baseTitle;
    if (shown && focus) {
      shown.focus();
    }
  }

  function say(text) {
    progress.textContent = text;
  }

  function chosenTopics() {
    return Array.prototype.map.call(
      form.querySelectorAll('input[name="topics"]:checked'),
      function (input) {
        return input.value;
      }
    );
  }

  function askPermission() {
    // Older Safari takes a callback instead of returning a promise.
    return new Promise(function (resolve) {
      var answer = Notification.requestPermission(resolve);
      if (answer && typeof answer.then === "function") {
        answer.then(resolve);
      }
    });
  }

  async function register(subscription, body) {
    unsent = { subscription: subscription, body: body };
    push.setPending(subscription.endpoint, body);
    var result = null;
    try {
      result = await push.postJSON("/api/push/subscribe", body);
    } catch (_) {
      result = null; // the network failed
    }
    if (result && result.ok) {
      unsent = null;
      push.clearPending();
      push.markHeartbeat();
      show("state-success", { focus: true });
      return;
    }
    show("state-failed", { focus: true });
  }

  async function subscribe(event) {
    event.preventDefault();
    if (busy) {
      return;
    }
    busy = true;
    button.setAttribute("aria-disabled", "true");
    try {
      var permission = Notification.permission;
      if (permission !== "granted" && permission !== "denied") {
        say("Waiting for your answer to the browser's question…");
        permission = await askPermission();
      }
      if (permission === "denied") {
        show("state-denied", { focus: true, form: true });
        return;
      }
      if (permission !== "granted") {
        show("state-dismissed", { focus: true, form: true });
        return;
      }
      say("Turning on notifications…");
      var subscription;
      try {
        await navigator.serviceWorker.register("/sw.js", { scope: "/" });
        subscription = await push.subscribeBrowser(await navigator.serviceWorker.ready);
      } catch (_) {
        show("state-browser-error", { focus: true, form: true });
        return;
      }
      var body = {
        subscription: subscription.toJSON(),
        source: "subscribe-page",
        timeZone: push.timeZone(),
      };
      if (page.dataset.policyVersion) {
        body.topics = chosenTopics();
        body.policyVersion = page.dataset.policyVersion;
      }
      await register(subscription, body);
    } finally {
      busy = false;
      button.removeAttribute("aria-disabled");
    }
  }

  async function retry() {
    if (unsent) {
      await register(unsent.subscription, unsent.body);
    }
  }

  async function cancel() {
    // Let go of the browser's subscription: the server never stored it.
    if (unsent) {
      try {
        await unsent.subscription.unsubscribe();
      } catch (_) {
        /* it is gone either way */
      }
    }
    unsent = null;
    push.clearPending();
    show("state-cancelled", { focus: true, form: true });
  }

  /* The server has nothing of this browser's at that endpoint (it never had it, or it
     ended): there is nothing to stop there, and letting go in the browser is all. */
  function notHeld(result) {
    var error = result.data && result.data.error;
    return result.status === 403 && Boolean(error) && error.code === "not_your_subscription";
  }

  async function unsubscribe() {
    var subscription = await push.currentSubscription();
    if (subscription) {
      // The server first: if it cannot be told, nothing changes and the person can retry.
      var result = null;
      try {
        result = await push.postJSON(
          "/api/push/unsubscribe",
          push.naming(subscription, { source: "subscribe-page" })
        );
      } catch (_) {
        result = null;
      }
      if (!result || (!result.ok && !notHeld(result))) {
        show("state-unsubscribe-failed", { focus: true });
        return;
      }
      try {
        await subscription.unsubscribe();
      } catch (_) {
        /* the server has revoked it: no more sends reach it anyway */
      }
    }
    push.clearHeartbeat();
    show("state-unsubscribed", { focus: true, form: true });
  }

  async function start() {
    if (push.isIOS() && !push.standalone()) {
      show("state-ios");
      return;
    }
    if (!push.supported()) {
      show("state-unsupported");
      return;
    }
    actions.hidden = false;
    var optionalTopics = document.getElementById("optional-topics");
    if (optionalTopics) {
      optionalTopics.hidden = false; // tickable only where the button can send them
    }
    form.addEventListener("submit", subscribe);
    document.getElementById("retry-button").addEventListener("click", retry);
    document.getElementById("cancel-button").addEventListener("click", cancel);
    document.getElementById("unsubscribe-button").addEventListener("click", unsubscribe);
    document.getElementById("unsubscribe-retry-button").addEventListener("click", unsubscribe);
    document.getElementById("check-retry-button").addEventListener("click", checkWithServer);

    var subscription = await push.currentSubscription();
    if (!subscription) {
      push.clearPending();
      // Nothing in this browser: what the server last knew of it (its device cookie)
      // says why, when it knows anything; a first visit is the page as it is.
      var known = page.dataset.serverStatus;
      if (known === "stopped" || known === "erased") {
        show("state-" + known, { form: true });
      } else if (known === "receiving" || known === "expired") {
        show("state-not-subscribed", { form: true });
      }
      return;
    }
    var waiting = push.pending();
    if (waiting && waiting.endpoint === subscription.endpoint) {
      // Subscribed in the browser but never registered: finish or cancel.
      unsent = { subscription: subscription, body: waiting.body };
      show("state-failed");
      return;
    }
    await checkWithServer();
  }

  /* Ask the server now what it holds for this browser's subscription and say that; a
     subscription it ended or does not know is dropped here and then. */
  async function checkWithServer() {
    show("state-checking");
    var outcome = await push.check("subscribe-page", page.dataset.policyVersion);
    if (outcome === "receiving") {
      show("state-subscribed");
    } else if (outcome === "stopped" || outcome === "erased") {
      show("state-" + outcome, { form: true });
    } else if (outcome === "unreachable") {
      show("state-check-failed", { focus: true });
    } else {
      show("state-not-subscribed", { form: true }); // unknown to the server, or none
    }
  }

  start().catch(function () {
    show("state-unsupported");
  });
})();
