"""The wire protocol of Web Push: encryption (RFC 8291), VAPID (RFC 8292) and the HTTPS transport.

The dispatch engine (campaigns, deliveries, claiming batches) builds on these pieces:
``encryption.encrypt`` seals one payload for one subscription, ``vapid.VapidSigner``
hands out the cached ``Authorization`` header per push-service origin, and
``transport.HttpsPushTransport`` posts the requests over pooled connections.
"""
