"""The seams: what code reaches through the application for, in one object.

Settings, the clock, the subscription key ring, the staff password hasher and the
factory of push transports are chosen once, by ``create_app``'s keywords, and read
through :func:`current_portal`. Tests pass their own to ``create_app`` (or change the
object's attributes) instead of reaching into ``app.extensions``.

A leaf: it imports only the types it holds, so any module may import it.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable
from dataclasses import dataclass, field
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


def system_user() -> str:
    """The operating-system user running this process, for the audit trail of commands:
    ``getpass.getuser()``, else the numeric uid, else ``unknown`` (a container may have
    neither ``$USER`` nor a passwd entry)."""
    try:
        name = getpass.getuser()
    except (OSError, KeyError, ImportError):
        uid = getattr(os, "getuid", None)
        name = f"uid {uid()}" if uid else ""
    return name or "unknown"


@dataclass
class Portal:
    """The seams services reach through the app."""

    settings: Settings
    clock: Clock
    keys: KeyRing
    passwords: Passwords
    transport_factory: TransportFactory
    # Who runs a ``portal …`` command (the audit trail's "command line (os user: …)").
    os_user: Callable[[], str] = field(default=system_user)


def current_portal(app: Flask | None = None) -> Portal:
    """The seams of ``app``, or of the application in context."""
    portal: Portal = (app if app is not None else current_app).extensions[EXTENSION]
    return portal
