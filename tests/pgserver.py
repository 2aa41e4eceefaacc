"""A private PostgreSQL server for tests that stop and start it.

The shared server other test runs use must never be stopped, so a test that takes the
database away starts its own: ``initdb`` into a temporary folder, trust authentication,
loopback only, a free port. When the tests run as root (initdb refuses to), the server
runs as the ``postgres`` operating-system user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

from tests.support import free_port


def postgres_bin() -> Path | None:
    """The newest installed server's bin folder (Debian keeps them versioned)."""
    found = sorted(
        (
            p
            for p in Path("/usr/lib/postgresql").glob("*/bin/initdb")
            if p.parent.parent.name.isdigit()
        ),
        key=lambda path: int(path.parent.parent.name),
    )
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PrivatePostgres:
    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.port = free_port()
        # Directly under the system temp folder: pytest's own folders are private to
        # the test user, which the server's user may not be.
        self.root = Path(tempfile.mkdtemp(prefix="portal-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._user: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            self._user = pwd.getpwnam("postgres")
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)

    def _run(self, *args: str, timeout: float = 120) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self._user is not None:
            command = ["runuser", "-u", self._user.pw_name, "--", *command]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{args[0]} failed ({result.returncode}): {result.stderr or result.stdout}\n"
                f"{self.server_log()}"
            )

    def server_log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text()
        return ""

    def init(self) -> None:
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c max_connections=100"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        with psycopg.connect(
            f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def remove(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class PrivatePgBouncer:
    """A PgBouncer in transaction mode in front of a private server (``.ci/pgbouncer``),
    for the fault-injection test when the run goes through a pooler."""

    def __init__(self, upstream_port: int) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="portal-pgbouncer-"))
        self.root.chmod(0o755)
        script = Path(__file__).resolve().parent.parent / ".ci" / "pgbouncer"
        self._script = str(script)
        result = subprocess.run(
            [self._script, "start", str(self.root / "run")],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            # Requests must fail within the test's bounds while the server is down.
            env={
                **os.environ,
                "PGBOUNCER_UPSTREAM_PORT": str(upstream_port),
                "PGBOUNCER_QUERY_WAIT_TIMEOUT": "3",
            },
        )
        if result.returncode != 0:
            raise RuntimeError(f"PgBouncer did not start: {result.stderr or result.stdout}")
        self.port = int(result.stdout.strip().splitlines()[-1])

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def remove(self) -> None:
        subprocess.run([self._script, "stop", str(self.root / "run")], timeout=60, check=False)
        shutil.rmtree(self.root, ignore_errors=True)
