"""The seams: what code reaches through the application for, in one object.

Settings, the clock, the subscription key ring, the staff password hasher and the
factory of push transports are chosen once, by ``create_app``'s keywords, and read
through :func:`current_portal`. Tests pass their own to ``create_app`` (or change the
object's attributes) instead of reaching into ``app.extensions``.

A leaf: it imports only the types it holds, so any module may import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flask import Flask, current_app

from portal.clock import Clock
from portal.config import Settings
from portal.staff.passwords import Passwords
from portal.subscriptions.sealing import KeyRing

if TYPE_CHECKING:
    from portal.push.transport import PushTransport

EXTENSION = "portal"

# Builds this process's push transport (its connections and VAPID signer) on first use.
TransportFactory = Callable[["Portal"], "PushTransport"]


@dataclass
class Portal:
    """The seams services reach through the app."""

    settings: Settings
    clock: Clock
    keys: KeyRing
    passwords: Passwords
    transport_factory: TransportFactory


def current_portal(app: Flask | None = None) -> Portal:
    """The seams of ``app``, or of the application in context."""
    portal: Portal = (app if app is not None else current_app).extensions[EXTENSION]
    return portal
