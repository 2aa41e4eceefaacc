/* The service worker, served as /sw.js with scope "/".

   push                   always shows a notification for a new delivery; a delivery id
                          seen before is never shown as a second notification (below)
   notificationclick      focuses a tab already at the link, or opens it (this site, or a
                          site LINK_ORIGINS names, only)
   pushsubscriptionchange subscribes again and tells the server which endpoint it replaces

   The server acts on a subscription only for the browser that holds it, so every fetch
   carries the cookies (credentials "same-origin": the device cookie names the
   subscription) and, for a browser whose cookies were cleared, the subscription's own
   auth secret.

   The payload is JSON: {"deliveryId", "campaignId", "title", "body", "url", "icon", "tag"},
   and when the campaign has them "image", "badge", "actions": [{"action", "title", "url"}]
   (at most two), "requireInteraction" and "silent" (docs/subscribe-page.md, "Push
   payload"). A click on a button opens its own link and is reported as its own receipt
   (the button's "action", like "action-1"). */
"use strict";

var DB_NAME = "portal-sw";
var DB_VERSION = 1;
var SEEN = "seen-deliveries";
var MAX_SEEN = 500; // repeats come from a crashed send, minutes apart: 500 ids is ample
// First sightings whose notification is being shown right now, by delivery id. Their
// transactions complete one after another, and a first sighting is entered here before the
// next one completes, so a repeat in this worker finds it while it is still being shown.
var showing = new Map();
/* Sites other than this one that campaign links and icons may lead to
   (CAMPAIGN_LINK_ORIGINS): the portal fills this line in when it serves /sw.js. */
var LINK_ORIGINS = [];
var MAX_ACTIONS = 2;
var ACTION_ID = /^action-[12]$/;

self.addEventListener("install", function () {
  self.skipWaiting();
});

self.addEventListener("activate", function (event) {
  event.waitUntil(self.clients.claim());
});

function openDb() {
  return new Promise(function (resolve, reject) {
    var request = indexedDB.open(DB_NAME, DB_VERSION);
    request.onupgradeneeded = function () {
      var store = request.result.createObjectStore(SEEN, { keyPath: "id" });
      store.createIndex("at", "at");
    };
    request.onsuccess = function () {
      resolve(request.result);
    };
    request.onerror = function () {
      reject(request.error);
    };
  });
}

/* Remembers the delivery id; resolves true the first time. The check and the write share
   one readwrite transaction, so two pushes with the same id cannot both be first. The
   oldest ids beyond MAX_SEEN are dropped in the same transaction. */
async function firstSighting(deliveryId) {
  var db = await openDb();
  try {
    return await new Promise(function (resolve, reject) {
      var tx = db.transaction(SEEN, "readwrite");
      var store = tx.objectStore(SEEN);
      var first = false;
      var lookup = store.get(deliveryId);
      lookup.onsuccess = function () {
        if (lookup.result) {
          return;
        }
        first = true;
        store.put({ id: deliveryId, at: Date.now() });
        var count = store.count();
        count.onsuccess = function () {
          var excess = count.result - MAX_SEEN;
          if (excess <= 0) {
            return;
          }
          store.index("at").openCursor().onsuccess = function (event) {
            var cursor = event.target.result;
            if (!cursor || excess <= 0) {
              return;
            }
            if (cursor.primaryKey !== deliveryId) {
              cursor.delete();
              excess -= 1;
            }
            cursor.continue();
          };
        };
      };
      tx.oncomplete = function () {
        resolve(first);
      };
      tx.onerror = function () {
        reject(tx.error);
      };
      tx.onabort = function () {
        reject(tx.error);
      };
    });
  } finally {
    db.close();
  }
}

function payload(data) {
  if (!data) {
    return {};
  }
  try {
    var value = data.json();
    return value && typeof value === "object" ? value : {};
  } catch (_) {
    return { body: data.text() };
  }
}

function text(value, max) {
  return typeof value === "string" ? value.slice(0, max) : "";
}

/* A link on this site or on a site campaigns may link to, else the fallback. The form
   refuses other links already; this second check means a payload cannot send people
   elsewhere either. */
function allowedLink(value, fallback) {
  if (typeof value === "string" && value) {
    try {
      var url = new URL(value, self.location.origin);
      if (url.origin === self.location.origin || LINK_ORIGINS.indexOf(url.origin) !== -1) {
        return url.href;
      }
    } catch (_) {
      /* not a URL */
    }
  }
  return fallback;
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

async function report(deliveryId, event) {
  // Evidence of display, never a condition for anything: losing one is acceptable.
  try {
    var subscription = await self.registration.pushManager.getSubscription();
    var body = {
      deliveryId: deliveryId,
      event: event,
      endpoint: subscription ? subscription.endpoint : null,
    };
    var auth = subscription ? authOf(subscription) : null;
    if (auth) {
      body.auth = auth;
    }
    await fetch("/api/push/receipt", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      credentials: "same-origin",
      body: JSON.stringify(body),
    });
  } catch (_) {
    /* offline: the notification still counts as shown */
  }
}

/* The payload's buttons that can be shown: at most two, each with our action id, a
   label and an allowed link (a button whose link is not allowed is left out). */
function buttons(value) {
  if (!Array.isArray(value)) {
    return [];
  }
  var found = [];
  for (var i = 0; i < value.length && found.length < MAX_ACTIONS; i += 1) {
    var item = value[i] || {};
    var url = allowedLink(item.url, null);
    var title = text(item.title, 40);
    if (typeof item.action === "string" && ACTION_ID.test(item.action) && title && url) {
      found.push({ action: item.action, title: title, url: url });
    }
  }
  return found;
}

async function handlePush(message) {
  var root = new URL("/", self.location.origin).href;
  var deliveryId =
    typeof message.deliveryId === "string" && message.deliveryId ? message.deliveryId.slice(0, 64) : null;
  var tag = text(message.tag, 128) || (deliveryId ? "delivery-" + deliveryId : "");
  var title = text(message.title, 200) || "Notification";
  var options = {
    body: text(message.body, 1000),
    data: {
      url: allowedLink(message.url, root),
      deliveryId: deliveryId,
      campaignId: message.campaignId === undefined ? null : message.campaignId,
    },
  };
  if (tag) {
    options.tag = tag;
  }
  var icon = allowedLink(message.icon, null);
  if (icon) {
    options.icon = icon;
  }
  var image = allowedLink(message.image, null);
  if (image) {
    options.image = image;
  }
  var badge = allowedLink(message.badge, null);
  if (badge) {
    options.badge = badge;
  }
  var actions = buttons(message.actions);
  if (actions.length) {
    options.actions = actions.map(function (a) {
      return { action: a.action, title: a.title };
    });
    options.data.actions = actions;
  }
  if (message.requireInteraction === true) {
    options.requireInteraction = true;
  }
  if (message.silent === true) {
    options.silent = true;
  }
  if (!deliveryId) {
    return self.registration.showNotification(title, options);
  }

  var first = true;
  try {
    first = await firstSighting(deliveryId);
  } catch (_) {
    first = true; // storage failed: showing twice is better than never showing
  }
  if (first) {
    var shown = self.registration.showNotification(title, options);
    showing.set(deliveryId, shown);
    try {
      await shown;
    } finally {
      showing.delete(deliveryId);
    }
    await report(deliveryId, "shown");
    return undefined;
  }

  // A repeat that arrives while the first is still being shown waits for it: until then
  // it is not among the open notifications, and this push would end with nothing on screen.
  var pending = showing.get(deliveryId);
  if (pending) {
    try {
      await pending;
    } catch (_) {
      /* it was not shown: there is nothing to replace */
    }
  }

  // A repeat of a delivery already shown (a send repeated after a crash). If its
  // notification is still on screen, show it again under the same tag: that replaces it
  // in place, without a second sound (renotify false), so the person sees it once and the
  // push still ends with a visible notification, as userVisibleOnly promises. If it was
  // dismissed or clicked already, show nothing: bringing it back is the very duplicate
  // this check prevents, and such repeats are too rare to exhaust a browser's allowance
  // for pushes that show nothing.
  var open = await self.registration.getNotifications({ tag: tag });
  var same = open.filter(function (n) {
    return n.data && n.data.deliveryId === deliveryId;
  })[0];
  if (same) {
    await self.registration.showNotification(same.title, {
      body: same.body,
      tag: same.tag,
      icon: same.icon || undefined,
      image: same.image || undefined,
      badge: same.badge || undefined,
      actions: same.actions || [],
      requireInteraction: same.requireInteraction === true,
      silent: same.silent === true,
      data: same.data,
      renotify: false,
    });
  }
  return undefined;
}

self.addEventListener("push", function (event) {
  event.waitUntil(handlePush(payload(event.data)));
});

async function focusOrOpen(url) {
  var windows = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
  for (var i = 0; i < windows.length; i += 1) {
    if (windows[i].url === url && "focus" in windows[i]) {
      return windows[i].focus();
    }
  }
  return self.clients.openWindow(url);
}

/* A click on one of our notifications: close it, bring its link forward, report it.
   A click on a button (``action``) opens that button's link and reports the button. */
function notificationClicked(notification, action) {
  notification.close();
  var data = notification.data || {};
  var url = allowedLink(data.url, new URL("/", self.location.origin).href);
  var event = "clicked";
  var chosen = (Array.isArray(data.actions) ? data.actions : []).filter(function (a) {
    return action && a && a.action === action;
  })[0];
  if (chosen) {
    url = allowedLink(chosen.url, url);
    event = chosen.action;
  }
  var work = [focusOrOpen(url)];
  if (data.deliveryId) {
    work.push(report(data.deliveryId, event));
  }
  return Promise.all(work);
}

self.addEventListener("notificationclick", function (event) {
  event.waitUntil(notificationClicked(event.notification, event.action));
});

function keyBytes(base64url) {
  var padded = base64url + "===".slice((base64url.length + 3) % 4);
  var raw = atob(padded.replace(/-/g, "+").replace(/_/g, "/"));
  var bytes = new Uint8Array(raw.length);
  for (var i = 0; i < raw.length; i += 1) {
    bytes[i] = raw.charCodeAt(i);
  }
  return bytes;
}

/* The server's current key (it may have been rotated), else the old subscription's. */
async function applicationServerKey(oldSubscription) {
  try {
    var response = await fetch("/api/push/vapid-public-key", { credentials: "same-origin" });
    if (response.ok) {
      var body = await response.json();
      if (body && body.publicKey) {
        return keyBytes(body.publicKey);
      }
    }
  } catch (_) {
    /* offline: fall back to the key the old subscription used */
  }
  if (oldSubscription && oldSubscription.options && oldSubscription.options.applicationServerKey) {
    return oldSubscription.options.applicationServerKey;
  }
  throw new Error("no application server key");
}

async function resubscribe(oldSubscription, newSubscription) {
  var fresh = newSubscription;
  if (!fresh) {
    fresh = await self.registration.pushManager.subscribe({
      userVisibleOnly: true,
      applicationServerKey: await applicationServerKey(oldSubscription),
    });
  }
  var headers = { "Content-Type": "application/json" };
  if (oldSubscription && oldSubscription.endpoint) {
    // The server moves the subscriber and its preferences to the new endpoint at once,
    // once this browser proves it held the old one: the device cookie, or the old
    // subscription's auth secret (event.oldSubscription still has its keys).
    var change = { oldEndpoint: oldSubscription.endpoint, subscription: fresh.toJSON() };
    var oldAuth = authOf(oldSubscription);
    if (oldAuth) {
      change.oldAuth = oldAuth;
    }
    var moved = await fetch("/api/push/change", {
      method: "POST",
      headers: headers,
      credentials: "same-origin",
      body: JSON.stringify(change),
    });
    if (moved.status === 410) {
      // The person ended the old subscription (or was erased): the new one was nobody's
      // choice, so the browser lets it go too.
      await fresh.unsubscribe();
      return moved;
    }
    if (moved.status !== 403) {
      return moved;
    }
    // Not proven (the server does not know the old endpoint as this browser's): the new
    // subscription is registered on its own below.
  }
  // No old endpoint (some browsers give none), or it could not be moved: the subscriber
  // cookie ties the new one to the same person. If this fails, the page's next
  // heartbeat finds the endpoint unknown and renews it for that person.
  var registered = await fetch("/api/push/subscribe", {
    method: "POST",
    headers: headers,
    credentials: "same-origin",
    body: JSON.stringify({ subscription: fresh.toJSON(), source: "service-worker" }),
  });
  if (registered.status === 410) {
    // This browser's subscription was ended by the person (or erasure): let it go.
    await fresh.unsubscribe();
  }
  return registered;
}

self.addEventListener("pushsubscriptionchange", function (event) {
  event.waitUntil(resubscribe(event.oldSubscription, event.newSubscription));
});
