"""Command line: ``flask --app app portal ...`` and ``flask --app app db ...``."""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

import click
from alembic import command
from flask import Flask, current_app
from flask.cli import AppGroup

from portal.config import generate_vapid_keys
from portal.db import db
from portal.migrate import alembic_config, migration_connection
from portal.staff import cli as staff_cli

portal_cli = AppGroup("portal", help="Operate the push consent portal.")
db_cli = AppGroup("db", help="Database migrations (Alembic).")
staff_cli.register(portal_cli)


class ClickProgress:
    """Progress on stderr for long jobs: a bar on a terminal; elsewhere (cron, a container's
    log) a plain line every ``interval`` seconds and one when a phase ends."""

    def __init__(self, label: str, *, interval: float = 10.0) -> None:
        self.label = label
        self.interval = interval
        self._bar: Any = None
        self._plain: list[int] | None = None  # [done, total] when not on a terminal
        self._last = 0.0

    def start(self, total: int) -> None:
        # A job of several phases (the sweep: stale, then expired) starts one bar each;
        # the one before is finished first, so each keeps a line of its own.
        self.close()
        if not sys.stderr.isatty():
            self._plain = [0, total]
            self._last = time.monotonic()
            self._line()
            return
        self._bar = click.progressbar(length=max(total, 1), label=self.label, file=sys.stderr)
        self._bar.__enter__()

    def advance(self, count: int) -> None:
        if self._bar is not None:
            self._bar.update(count)
        elif self._plain is not None:
            self._plain[0] += count
            if time.monotonic() - self._last >= self.interval:
                self._last = time.monotonic()
                self._line()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None
        elif self._plain is not None:
            self._line()
            self._plain = None

    def _line(self) -> None:
        assert self._plain is not None
        done, total = self._plain
        share = f" ({100 * done // total}%)" if total else ""
        click.echo(f"{self.label}: {done:,} of {total:,}{share}", err=True)


@portal_cli.command("run-job")
@click.argument("name")
def run_job_command(name: str) -> None:
    """Run one background job once, with progress."""
    from portal.jobs import job_names
    from portal.operations.actions import RAN_BY_HAND
    from portal.operations.scheduler import JobBusy, run_recorded
    from portal.staff import audit

    if name not in job_names():
        raise click.BadParameter(
            f"unknown job; choose from {', '.join(job_names())}", param_hint="NAME"
        )
    progress = ClickProgress(name)
    try:
        report = run_recorded(
            current_app._get_current_object(),  # type: ignore[attr-defined]
            name,
            trigger="command",
            progress=progress,
        )
    except JobBusy:
        click.echo(f"{name} is running in another process right now; try again later", err=True)
        sys.exit(2)
    finally:
        progress.close()
    assert report is not None
    with db.begin() as session:  # as the jobs page's button does
        audit.record(
            session,
            audit.command_line_actor(),
            RAN_BY_HAND,
            f"job:{name}",
            {"changed": report.changed},
        )
    click.echo(report.summary())
    for problem in report.problems:
        click.echo(f"  problem: {problem}", err=True)
    if report.problems:
        sys.exit(1)


@portal_cli.command("scheduler")
def scheduler_command() -> None:
    """Run the scheduler in this process, in the foreground, until stopped."""
    from portal.operations.scheduler import PortalScheduler

    scheduler = PortalScheduler(current_app._get_current_object())  # type: ignore[attr-defined]
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    scheduler.start()
    click.echo("scheduler running; stop with Ctrl-C or SIGTERM", err=True)
    stopping.wait()
    click.echo("finishing the current batch…", err=True)
    scheduler.shutdown()


@portal_cli.command("vapid-keys")
def vapid_keys_command() -> None:
    """Print a new VAPID key pair for VAPID_PRIVATE_KEY and VAPID_PUBLIC_KEY."""
    private, public = generate_vapid_keys()
    click.echo(f"VAPID_PRIVATE_KEY={private}")
    click.echo(f"VAPID_PUBLIC_KEY={public}")


def _alembic(fn: Any, *args: Any, **kwargs: Any) -> None:
    with migration_connection(db.engine) as connection:
        fn(alembic_config(connection), *args, **kwargs)


@db_cli.command("upgrade")
@click.argument("revision", default="head")
def db_upgrade(revision: str) -> None:
    """Apply migrations up to REVISION (default: head)."""
    _alembic(command.upgrade, revision)


@db_cli.command("downgrade")
@click.argument("revision")
def db_downgrade(revision: str) -> None:
    """Revert migrations down to REVISION."""
    _alembic(command.downgrade, revision)


@db_cli.command("current")
def db_current() -> None:
    """Show the database's revision."""
    _alembic(command.current, verbose=True)


@db_cli.command("history")
def db_history() -> None:
    """List the migrations."""
    command.history(alembic_config(), verbose=True)


@db_cli.command("revision")
@click.option("-m", "--message", required=True)
@click.option("--autogenerate", is_flag=True, help="Diff the models against the database.")
def db_revision(message: str, autogenerate: bool) -> None:
    """Write a new migration (review an autogenerated one before committing it)."""
    _alembic(command.revision, message=message, autogenerate=autogenerate)


def register(app: Flask) -> None:
    app.cli.add_command(portal_cli)
    app.cli.add_command(db_cli)
