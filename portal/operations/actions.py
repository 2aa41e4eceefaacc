"""The operations package's audit action: a background job run by hand (the jobs page's
button, or ``portal run-job``)."""

from __future__ import annotations

from portal.staff import audit

RAN_BY_HAND = "operations.job_run"

audit.register_action(RAN_BY_HAND, "Background job run by hand")
