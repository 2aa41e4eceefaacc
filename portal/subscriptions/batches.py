"""Keyset-paginated batches over push subscriptions (the ageing sweeps, tombstones, purge,
re-sealing and the backfills): :func:`portal.batches.keyset_batches` on that table."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

import sqlalchemy as sa
from flask import Flask
from sqlalchemy.orm import Session

from portal.batches import keyset_batches
from portal.jobreport import JobReport, Progress
from portal.subscriptions.models import PushSubscription

_t = cast(sa.Table, PushSubscription.__table__)


def subscription_batches(
    app: Flask,
    candidates: sa.ColumnElement[bool],
    *,
    batch_size: int,
    progress: Progress,
    handle: Callable[[Session, Sequence[sa.Row[Any]]], int],
    stop: threading.Event | None,
    report: JobReport,
    columns: tuple[sa.ColumnElement[Any], ...] = (),
    between: Callable[[], bool] | None = None,
) -> None:
    """Walk the push subscriptions matching ``candidates`` by primary key in batches
    (:func:`portal.batches.keyset_batches`, which says how). Each row carries its id as
    ``id`` as well as ``key``."""
    keyset_batches(
        app,
        _t,
        candidates,
        batch_size=batch_size,
        progress=progress,
        handle=handle,
        stop=stop,
        report=report,
        columns=(_t.c.id, *columns),
        between=between,
    )
