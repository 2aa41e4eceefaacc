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
