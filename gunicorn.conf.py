"""gunicorn settings for the portal: ``gunicorn -c gunicorn.conf.py app:app``.

Metrics are per process under gunicorn, so prometheus_client runs in multi-process mode:
the directory must be known before any worker imports prometheus_client.
"""

import os
import tempfile
from pathlib import Path

_metrics_dir = os.environ.setdefault(
    "PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="portal-metrics-")
)
Path(_metrics_dir).mkdir(parents=True, exist_ok=True)

# Imported once the metrics folder is known (importing portal imports prometheus_client).
from portal.logconfig import gunicorn_config  # noqa: E402

bind = os.environ.get("PORTAL_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
threads = int(os.environ.get("PORTAL_THREADS", "4"))
worker_class = "gthread"
timeout = 30
graceful_timeout = 30
accesslog = "-"
# Access-log lines without bearer tokens (preference-link tokens, sign-in assertions,
# erasure-receipt tokens) or control characters, whatever access_log_format says.
logger_class = "portal.accesslog.AccessLogger"
# The portal's one logging configuration (portal/logconfig.py): gunicorn's error and access
# lines and the application's records, JSON lines on standard error.
logconfig_dict = gunicorn_config()
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")


def on_starting(server):  # noqa: ANN001, ANN201
    # Values left by a previous run would be summed into this one's.
    for stale in Path(_metrics_dir).glob("*.db"):
        stale.unlink()


def child_exit(server, worker):  # noqa: ANN001, ANN201
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def worker_exit(server, worker):  # noqa: ANN001, ANN201
    # Stop this worker's scheduler now, while the interpreter still runs: a job checks
    # the stop flag between batches, so it ends after the batch in hand. Left to atexit,
    # the stop would come only after the job had run to its end (the interpreter joins
    # the job's thread first), or never, once graceful_timeout had passed.
    extensions = getattr(getattr(worker, "wsgi", None), "extensions", None) or {}
    scheduler = extensions.get("portal.scheduler")
    if scheduler is not None:
        scheduler.shutdown()
