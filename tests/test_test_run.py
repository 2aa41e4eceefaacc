"""The test run itself: a test that fails fails the run, nothing reruns it until it passes
(``tests/conftest.py`` refuses to start with such a plugin loaded)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def collect(plugins: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """A pytest run of one small file, collection only, with ``plugins`` importable."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugins), str(ROOT)])}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only"]
    return subprocess.run(
        [*command, *options, "tests/test_smoke.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# The module names of pytest-rerunfailures, pytest-retry and flaky's plugin.
STAND_INS = ("flaky_pytest_plugin", "pytest_rerunfailures", "pytest_retry")


def test_the_run_refuses_to_start_with_a_plugin_that_reruns_failed_tests(tmp_path):
    for module in STAND_INS:
        (tmp_path / f"{module}.py").write_text('"""A stand-in: loading it is what counts."""\n')
    refused = collect(tmp_path, *(option for m in STAND_INS for option in ("-p", m)))
    assert refused.returncode == pytest.ExitCode.USAGE_ERROR, refused.stdout + refused.stderr
    named = ", ".join(f"{m} (-p no:{m})" for m in STAND_INS)
    assert f"a plugin that reruns failed tests is loaded: {named};" in refused.stderr


def test_the_run_starts_without_one(tmp_path):
    started = collect(tmp_path)
    assert started.returncode == pytest.ExitCode.OK, started.stdout + started.stderr
    assert "1 test collected" in started.stdout


# Under pytest-xdist every worker makes databases of its own; their names say whose.


@pytest.mark.postgres_only
def test_each_worker_s_databases_are_named_for_the_run_and_the_worker(pg_server, pytestconfig):
    from tests.conftest import WORKER, database_prefix

    url = pg_server.create()
    try:
        name = url.rpartition("/")[2]
        assert name.startswith(f"{database_prefix(pytestconfig)}_")
        assert f"_{WORKER}_" in name
    finally:
        pg_server.drop(url)


@pytest.mark.postgres_only
def test_the_run_drops_the_databases_a_worker_left_and_no_other_run_s():
    from tests.conftest import TEST_DATABASE, PostgresServer

    left_by_a_crashed_worker = PostgresServer(TEST_DATABASE, prefix="portal_test_0dead0_gw7")
    another_run = PostgresServer(TEST_DATABASE, prefix="portal_test_0live0_gw0")
    left = left_by_a_crashed_worker.create()
    kept = another_run.create()
    try:
        dropped = PostgresServer(TEST_DATABASE).drop_run("0dead0")
        assert dropped == [left.rpartition("/")[2]]
        assert PostgresServer(TEST_DATABASE).drop_run("0dead0") == []
    finally:
        another_run.drop(kept)
        left_by_a_crashed_worker.drop(left)


# CI's PostgreSQL pass leaves out the tests marked no_database (tests/conftest.py):
# the mark must never land on a test that reaches the run's database.


def test_a_test_that_reaches_the_database_runs_on_both_backends(database_url, request):
    assert request.node.get_closest_marker("no_database") is None


def test_a_test_through_the_app_fixture_runs_on_both_backends(app, request):
    assert request.node.get_closest_marker("no_database") is None


def test_a_test_that_reaches_no_database_runs_on_one_backend(tmp_path, request):
    assert request.node.get_closest_marker("no_database") is not None


@pytest.mark.postgres_only
def test_a_postgres_only_test_is_never_left_out_of_the_postgres_pass(request):
    assert request.node.get_closest_marker("no_database") is None


def test_auto_starts_one_worker_more_than_the_cpus(monkeypatch, pytestconfig):
    from tests.conftest import pytest_xdist_auto_num_workers

    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    cpus = len(os.sched_getaffinity(0))
    assert pytest_xdist_auto_num_workers(pytestconfig) == cpus + 1
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "5")
    assert pytest_xdist_auto_num_workers(pytestconfig) == 5
