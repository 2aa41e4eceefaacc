"""Running the portal as a real server for tests: free ports, waiting for readiness."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import requests

from portal.config import Settings

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_environ(**extra: str) -> dict[str, str]:
    """The process environment without any portal setting, plus ``extra``."""
    prefixes = (
        "PORTAL_",
        "DATABASE_URL",
        "SECRET_KEY",
        "VAPID_",
        "SUBSCRIPTION_AUTH",
        "PROMETHEUS_",
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    environ.update(extra)
    return environ


def portal_process_environ(settings: Settings, tmp_path: Path, **extra: str) -> dict[str, str]:
    """A portal process's whole configuration from the environment alone: this test's
    database, secret and keys, in development mode with no migration or demo data."""
    from tests.conftest import KEY_V1, VAPID_PRIVATE, VAPID_PUBLIC

    return clean_environ(
        PORTAL_ENV="development",
        PORTAL_INSTANCE_PATH=str(tmp_path / "instance"),
        PORTAL_AUTO_MIGRATE="off",
        PORTAL_DEMO_DATA="off",
        DATABASE_URL=settings.database_url,
        SECRET_KEY=settings.secret_key,
        VAPID_PRIVATE_KEY=VAPID_PRIVATE,
        VAPID_PUBLIC_KEY=VAPID_PUBLIC,
        VAPID_SUBJECT="mailto:ops@example.test",
        SUBSCRIPTION_AUTH_KEY_V1=KEY_V1,
        SUBSCRIPTION_AUTH_KEY_VERSION="1",
        **extra,
    )


def wait_until_up(url: str, process: subprocess.Popen, timeout: float = 60) -> requests.Response:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            return requests.get(url, timeout=2)
        except (requests.ConnectionError, requests.Timeout):
            # gunicorn's master accepts connections before its workers have booted.
            time.sleep(0.2)
    raise TimeoutError(url)


def stop(process: subprocess.Popen) -> str:
    """Stop the server and everything it started (it runs in a session of its own)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        out, _ = process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, _ = process.communicate()
    return out or ""
