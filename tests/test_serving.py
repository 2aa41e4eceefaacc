"""The portal as operators run it: the README's run command, gunicorn with several workers."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.factories import SubscriptionFactory
from tests.support import ROOT, clean_environ, free_port, stop, wait_until_up

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def _tracked_copy(target: Path) -> Path:
    """The repository as a fresh clone has it: tracked files only, no instance folder."""
    files = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def _readme_run_command() -> str:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```(?:sh|bash|shell)?\n(.*?)```", readme, re.S)
    assert block, "README must open with a code block holding the two commands"
    run = block.group(1).strip().splitlines()[0]
    assert "flask --app app run" in run
    return run


def test_readme_run_command_serves_the_portal_from_a_fresh_copy(tmp_path):
    clone = _tracked_copy(tmp_path / "clone")
    run = _readme_run_command()
    # The install half is what `.ci/run` proves on a real clean clone; here the project
    # is already installed, so start the server part of the command as written.
    server = run[run.index("flask --app app run") :]
    port = free_port()
    command = f"{BIN}/{server} --port {port}"
    process = subprocess.Popen(
        command,
        shell=True,
        cwd=clone,
        env=clean_environ(PYTHONPATH=str(clone)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        health = wait_until_up(f"http://127.0.0.1:{port}/healthz", process)
        assert health.status_code == 200
        assert health.json() == {"status": "ok", "database": "ok"}
        assert requests.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 200
        assert (clone / "instance" / "portal.sqlite3").exists()
        assert (clone / "instance" / "portal-secrets.json").exists()
    finally:
        stop(process)


def test_metrics_add_up_across_gunicorn_workers(tmp_path):
    port = free_port()
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    environ = clean_environ(
        PORTAL_INSTANCE_PATH=str(tmp_path / "instance"),
        PORTAL_BIND=f"127.0.0.1:{port}",
        PORTAL_SCHEDULER="off",
        WEB_CONCURRENCY="3",
        PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
        PUSH_ALLOWED_HOSTS="fcm.googleapis.com",
    )
    # Migrate once before the workers start, as an operator would.
    subprocess.run(
        [BIN / "flask", "--app", "app", "db", "upgrade"],
        cwd=ROOT,
        env=environ,
        check=True,
        capture_output=True,
    )
    process = subprocess.Popen(
        [BIN / "gunicorn", "-c", "gunicorn.conf.py", "app:app"],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_until_up(f"http://127.0.0.1:{port}/healthz", process)
        factory = SubscriptionFactory()

        def worker_pids() -> set[str]:
            return {path.name.rsplit("_", 1)[-1] for path in metrics_dir.glob("counter_*.db")}

        # The first worker may answer while the others are still booting: keep posting
        # (boundedly) until a second one has taken a request.
        posted = 0
        deadline = time.monotonic() + 60
        while posted < 24 or (len(worker_pids()) < 2 and time.monotonic() < deadline):
            with requests.Session() as fresh:  # a new connection each time: spread over workers
                answer = fresh.post(
                    f"http://127.0.0.1:{port}/api/push/subscribe",
                    json={"subscription": factory().to_json()},
                    timeout=10,
                )
                assert answer.status_code == 201
            posted += 1
            if posted >= 24 and len(worker_pids()) < 2:
                time.sleep(0.2)
        assert len(worker_pids()) >= 2, "requests should have reached more than one worker"
        for _ in range(6):  # every worker answers with the same, whole total
            text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            match = re.search(
                r'^push_subscription_upserts_total\{result="inserted"\} (\S+)$', text, re.M
            )
            assert match and float(match.group(1)) == posted
    finally:
        stop(process)
