"""The operations page for the scheduler: each job, what it does, its last and next run,
and the recent runs.

Admins only; the routes sit on the staff console's blueprint, which signs staff in and
checks roles and CSRF for every page under ``/staff``.
"""

from __future__ import annotations

import sqlalchemy as sa
from flask import current_app, flash, redirect, render_template, url_for
from werkzeug.wrappers import Response

from portal.db import db
from portal.jobs import job_names, scheduled_jobs
from portal.operations.actions import RAN_BY_HAND
from portal.operations.models import RECENT_RUNS_LISTED, JobRun
from portal.operations.scheduler import JobBusy, run_recorded
from portal.operations.status import statuses
from portal.seams import current_portal
from portal.staff import audit
from portal.staff.access import StaffPage, current_staff, not_found_page, staff_required
from portal.staff.blueprint import bp
from portal.staff.forms import ConfirmForm
from portal.staff.models import Role

RECENT = RECENT_RUNS_LISTED
# Its pages on the staff dashboard (create_app lists them, in its order).
PAGES = (
    StaffPage(
        "staff.jobs_ops",
        "Background jobs",
        "When each job runs next, what its recent runs did, and running one now.",
    ),
)


@bp.get("/ops/jobs")
@staff_required(Role.ADMIN)
def jobs_ops() -> str:
    session = db.session
    portal = current_portal()
    runs = session.scalars(sa.select(JobRun).order_by(JobRun.id.desc()).limit(RECENT)).all()
    scheduler = current_app.extensions.get("portal.scheduler")
    return render_template(
        "staff/ops/jobs.html",
        jobs=statuses(session, portal.settings, portal.clock.now()),
        runs=runs,
        form=ConfirmForm(),
        scheduler_on=portal.settings.scheduler,
        scheduler_running=bool(scheduler and scheduler.started),
        recent=RECENT,
    )


@bp.post("/ops/jobs/<name>/run")
@staff_required(Role.ADMIN)
def jobs_run(name: str) -> Response | tuple[str, int]:
    if name not in job_names():
        return not_found_page("job", "staff.jobs_ops", "the background jobs")
    form = ConfirmForm()
    if not form.validate():
        return redirect(url_for("staff.jobs_ops"), 303)
    if name not in {entry.name for entry in scheduled_jobs()}:
        flash(f"{name} is run from the command line only: portal run-job {name}.", "info")
        return redirect(url_for("staff.jobs_ops"), 303)
    db.session.commit()  # hold nothing while the job runs (SQLite: its write lock)
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    try:
        report = run_recorded(app, name, trigger="staff")
    except JobBusy:
        flash(f"{name} is running in another process right now. Try again in a moment.", "info")
        return redirect(url_for("staff.jobs_ops"), 303)
    assert report is not None
    audit.record(
        db.session, current_staff(), RAN_BY_HAND, f"job:{name}", {"changed": report.changed}
    )
    db.session.commit()
    flash(report.summary(), "success")
    return redirect(url_for("staff.jobs_ops"), 303)
