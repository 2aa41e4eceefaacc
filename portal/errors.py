"""Errors the JSON API answers with: ``{"error": {"code", "message", "field"}}``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class ApiError(Exception):
    """A request the API refuses, with the status and the machine-readable code."""

    status = 400

    def __init__(
        self,
        code: str,
        message: str,
        field: str | None = None,
        *,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.headers: dict[str, str] = dict(headers or {})
        if status is not None:
            self.status = status

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        return {"error": body}


class ValidationError(ApiError):
    """Input that is well-formed JSON but not acceptable (422 unless told otherwise)."""

    status = 422


class NotFound(ApiError):
    status = 404


class Conflict(ApiError):
    status = 409
