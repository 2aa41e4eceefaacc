"""A sender beside the pages keeps to its share of a CPU (SPEC §7: dispatch beside the
pages). In a web worker the embedded scheduler's dispatch ticks rest after each batch
until the CPU the batch cost is at most ``DISPATCH_WEB_CPU_SHARE`` of the time since it
began; a ``portal scheduler`` process sends at full speed."""

from __future__ import annotations

import os
import sys
import threading
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY

from portal.delivery.engine import Dispatcher, EngineSettings, Pace
from portal.delivery.jobs import dispatch_job
from portal.jobreport import NoProgress
from portal.operations.scheduler import (
    SWITCH_INTERVAL_SECONDS,
    PortalScheduler,
    install,
    lower_thread_priority,
)
from tests.delivery.test_engine import _launch, _subscribe


class _Clocks:
    def __init__(self) -> None:
        self.cpu = 0.0
        self.wall = 100.0


def _pace(share: float) -> tuple[Pace, _Clocks]:
    clocks = _Clocks()
    return Pace(share, cpu_clock=lambda: clocks.cpu, wall_clock=lambda: clocks.wall), clocks


def test_a_batch_rests_until_its_cpu_is_the_share_of_its_time():
    pace, clocks = _pace(0.25)
    pace.start()
    clocks.cpu += 0.05  # 50 ms of this thread's CPU ...
    clocks.wall += 0.08  # ... in 80 ms
    # 50 ms is a quarter of 200 ms: 120 ms more.
    assert pace.due_rest(0.0) == pytest.approx(0.12)
    # The recorder thread's 30 ms for the batch written meanwhile count too.
    assert pace.due_rest(0.03) == pytest.approx(0.24)


def test_a_batch_that_waited_on_the_network_needs_no_rest():
    pace, clocks = _pace(0.25)
    pace.start()
    clocks.cpu += 0.01
    clocks.wall += 0.5  # mostly waiting for the push services: 2 % of a CPU
    assert pace.due_rest(0.0) == 0.0


def test_a_full_share_never_rests():
    pace, clocks = _pace(1.0)
    pace.start()
    clocks.cpu += 1.0
    clocks.wall += 0.001
    assert pace.due_rest(5.0) == 0.0
    assert pace.rest(5.0, None) == 0.0


def test_a_stop_ends_the_rest_at_once():
    pace, clocks = _pace(0.01)
    pace.start()
    clocks.cpu += 10.0  # would ask for 1,000 s
    stop = threading.Event()
    stop.set()
    rested = threading.Event()
    worker = threading.Thread(target=lambda: (pace.rest(0.0, stop), rested.set()))
    worker.start()
    assert rested.wait(5)
    worker.join()


def test_a_paced_tick_rests_between_batches_and_still_sends_everyone(
    push_app, dispatcher, fake_push, clock
):
    subs = [_subscribe(push_app, fake_push, topics=["weekly-digest"]) for _ in range(4)]
    _launch(push_app, clock)
    paced = Dispatcher(
        push_app, dispatcher.transport, settings=EngineSettings(batch_size=1), rand=lambda: 0.0
    )
    rested_before = _rested_metric()
    report = paced.tick(cpu_share=0.05)
    assert report.accepted == 4
    assert all(len(fake_push.received(sub)) == 1 for sub in subs)
    assert report.rested > 0  # a 5 % share leaves a real batch's CPU a rest to take
    # What operators see: the rests, counted in seconds.
    assert _rested_metric() - rested_before == pytest.approx(report.rested)


def _rested_metric() -> float:
    return REGISTRY.get_sample_value("push_sender_rested_seconds_total") or 0.0


def test_an_unpaced_tick_never_rests(push_app, dispatcher, fake_push, clock):
    _subscribe(push_app, fake_push, topics=["weekly-digest"])
    _launch(push_app, clock)
    report = dispatcher.tick()
    assert report.accepted == 1
    assert report.rested == 0.0


def test_the_web_workers_scheduler_paces_dispatch_and_a_scheduler_process_does_not(
    push_app, monkeypatch
):
    shares: list[float] = []
    monkeypatch.setattr(
        Dispatcher, "tick", lambda self, **kwargs: shares.append(kwargs["cpu_share"]) or _Tick()
    )
    switch_interval = sys.getswitchinterval()
    interval = _SwitchInterval(switch_interval)
    monkeypatch.setattr(sys, "setswitchinterval", interval)
    monkeypatch.setattr(sys, "getswitchinterval", lambda: interval.value)
    dispatch_job(push_app, NoProgress())  # no scheduler started (a test, `portal run-job`)
    standalone = PortalScheduler(push_app)  # `portal scheduler`'s
    standalone.scheduler = _NoJobs()
    standalone.start()
    assert sys.getswitchinterval() == switch_interval  # left as Python has it
    dispatch_job(push_app, NoProgress())
    web = install(push_app)  # a web worker's: started by its first request
    web.scheduler = _NoJobs()
    assert push_app.test_client().get("/healthz").status_code == 200
    assert web.started
    # Request threads get the interpreter's lock back from the sender within 1 ms.
    assert sys.getswitchinterval() == SWITCH_INTERVAL_SECONDS == 0.001
    dispatch_job(push_app, NoProgress())
    setting = push_app.extensions["portal"].settings.dispatch_web_cpu_share
    assert setting == 0.1  # the documented default
    assert shares == [1.0, 1.0, setting]
    web.shutdown()
    standalone.shutdown()


def _niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _in_a_thread(work) -> None:
    thread = threading.Thread(target=work)
    thread.start()
    thread.join(10)


linux_only = pytest.mark.skipif(
    sys.platform != "linux", reason="a niceness of its own for each thread is Linux's"
)


@linux_only
def test_a_lowered_thread_and_the_threads_it_starts_run_below_the_rest_of_the_process():
    base = _niceness()
    seen: dict[str, int] = {}

    def job() -> None:
        lower_thread_priority(10)
        seen["job"] = _niceness()
        _in_a_thread(lambda: seen.__setitem__("started by it", _niceness()))
        lower_thread_priority(5)  # once a thread is lowered it stays so, never back up
        seen["again"] = _niceness()

    _in_a_thread(job)
    assert seen == dict.fromkeys(("job", "started by it", "again"), max(base, 10))
    assert _niceness() == base  # the rest of the process: as it was
    # 0 changes nothing.
    _in_a_thread(lambda: (lower_thread_priority(0), seen.__setitem__("zero", _niceness())))
    assert seen["zero"] == base


@linux_only
def test_the_web_workers_job_threads_run_below_the_pages_and_a_scheduler_processs_do_not(
    push_app, monkeypatch
):
    niceness: list[int] = []
    monkeypatch.setattr(
        "portal.jobs.run_job",
        lambda app, name, **kwargs: niceness.append(_niceness()) or SimpleNamespace(processed=0),
    )
    base = _niceness()
    standalone = PortalScheduler(push_app)  # `portal scheduler`'s
    standalone.scheduler = _NoJobs()
    standalone.start()
    _in_a_thread(lambda: standalone._tick("dispatch"))
    web = install(push_app)  # a web worker's, started by its first request
    web.scheduler = _NoJobs()
    monkeypatch.setattr(sys, "setswitchinterval", _SwitchInterval(sys.getswitchinterval()))
    assert push_app.test_client().get("/healthz").status_code == 200
    assert web.niceness == push_app.extensions["portal"].settings.dispatch_web_nice == 10
    _in_a_thread(lambda: web._tick("dispatch"))
    assert niceness == [base, max(base, 10)]
    assert _niceness() == base  # the request threads' niceness is untouched
    web.shutdown()
    standalone.shutdown()


class _SwitchInterval:
    """sys.setswitchinterval for a test: remembered and read back through
    sys.getswitchinterval, never changing the interpreter running the tests."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __call__(self, value: float) -> None:
        self.value = value


class _Tick:
    claimed = accepted = failed = revoked = skipped = 0


class _NoJobs:
    """APScheduler's place: the jobs added, never run."""

    def add_job(self, *args, **kwargs) -> None:
        pass

    def start(self) -> None:
        pass

    def shutdown(self, wait: bool = True) -> None:
        pass
