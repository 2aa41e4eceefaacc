"""Liveness for load balancers: 200 when the database answers."""

from __future__ import annotations

import sqlalchemy as sa
from flask import Blueprint, Response, jsonify
from sqlalchemy.exc import SQLAlchemyError

from portal.db import db

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> tuple[Response, int]:
    try:
        with db.engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
    except SQLAlchemyError:
        return jsonify({"status": "unavailable", "database": "unreachable"}), 503
    return jsonify({"status": "ok", "database": "ok"}), 200
