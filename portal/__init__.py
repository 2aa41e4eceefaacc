"""The push consent portal: the application factory."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flask import Flask, Response, g, request
from flask_wtf.csrf import CSRFProtect

from portal import accesslog, inputs, logconfig, ratelimit, security
from portal.accesslog import loggable_path
from portal.clock import Clock, SystemClock
from portal.config import Settings
from portal.db import db
from portal.seams import EXTENSION, Portal, TransportFactory, system_user
from portal.staff.passwords import Passwords
from portal.subscriptions.sealing import KeyRing

ROOT = Path(__file__).resolve().parent.parent
csrf = CSRFProtect()
log = logging.getLogger("portal")


class _Flask(Flask):
    def log_exception(self, exc_info: Any) -> None:
        # Flask's own line, with the path escaped and without a bearer token in it.
        self.logger.error(
            "Exception on %s [%s]", loggable_path(request.path), request.method, exc_info=exc_info
        )


__all__ = ["Portal", "create_app"]


def create_app(
    settings: Settings | None = None,
    *,
    clock: Clock | None = None,
    keys: KeyRing | None = None,
    passwords: Passwords | None = None,
    transport_factory: TransportFactory | None = None,
    os_user: Callable[[], str] | None = None,
) -> Flask:
    """The application. Each keyword replaces one seam (see :mod:`portal.seams`); left
    out, it is built from the settings (themselves read from the environment)."""
    app = _Flask(
        __name__,
        instance_path=os.environ.get("PORTAL_INSTANCE_PATH") or str(ROOT / "instance"),
        template_folder=str(ROOT / "templates"),
        static_folder=str(ROOT / "static"),
        static_url_path="/static",
    )
    if settings is None:
        settings = Settings.from_env(os.environ, app.instance_path)
    app.config.update(
        SECRET_KEY=settings.secret_key,
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=settings.is_production,
        WTF_CSRF_TIME_LIMIT=None if not settings.is_production else 8 * 3600,
        TEMPLATES_AUTO_RELOAD=not settings.is_production,
    )
    if transport_factory is None:
        from portal.delivery.jobs import https_transport

        transport_factory = https_transport
    app.extensions[EXTENSION] = Portal(
        settings=settings,
        clock=clock or SystemClock(),
        keys=keys or KeyRing(settings.auth_keys, settings.auth_key_version),
        passwords=passwords or Passwords(),
        transport_factory=transport_factory,
        os_user=os_user or system_user,
    )

    accesslog.install()  # the development server's request log
    logconfig.configure(production=settings.is_production)  # JSON lines in production
    db.init_app(app, settings)
    csrf.init_app(app)
    security.init_app(app)
    inputs.init_app(app)
    ratelimit.init_app(app)
    _register_blueprints(app)
    _instrument(app)

    from portal.jobs import check_table

    check_table()  # a job the scheduler could not run refuses the start
    if settings.scheduler:
        from portal.operations.scheduler import install

        install(app)
    if settings.auto_migrate:
        from portal.migrate import upgrade

        upgrade(app.extensions["portal.db"].engine)
    if settings.seed_demo_data and settings.auto_migrate:
        from portal.consent.demo import seed

        seed(app)
    return app


def _register_blueprints(app: Flask) -> None:
    from portal import api, cli, health, metrics, openapi, pages
    from portal.campaigns import cli as campaign_cli
    from portal.campaigns import device_views as test_device_pages
    from portal.campaigns import media_views as campaign_pictures
    from portal.campaigns import views as campaign_pages
    from portal.compliance import cli as compliance_cli
    from portal.compliance import views as compliance_pages
    from portal.consent import cli as consent_cli
    from portal.consent import log_api as consent_log_api
    from portal.consent import views as consent_views
    from portal.delivery import receipts
    from portal.feedback import ops as feedback_pages
    from portal.feedback import views as feedback_views
    from portal.operations import views as operations_pages
    from portal.retention import views as erasure_views
    from portal.staff import blueprint as staff_console
    from portal.staff import catalogue_views as catalogue_pages
    from portal.staff import views as staff_pages
    from portal.staff.access import register_page
    from portal.subscriptions import views as subscription_views

    api.register_error_handlers(app)
    app.register_blueprint(health.bp)
    app.register_blueprint(metrics.bp)
    app.register_blueprint(pages.bp)
    app.register_blueprint(campaign_pictures.bp)
    app.register_blueprint(consent_views.bp)
    app.register_blueprint(erasure_views.bp)
    app.register_blueprint(subscription_views.bp)
    app.register_blueprint(consent_views.api)
    app.register_blueprint(consent_log_api.bp)
    # The staff console: one blueprint (its sign-in check, headers and CSRF page) that
    # these modules hang their pages on as they are imported above. The dashboard lists
    # their pages in this order.
    staff_page_modules = (
        staff_pages,
        campaign_pages,
        test_device_pages,
        feedback_pages,
        operations_pages,
        compliance_pages,
        catalogue_pages,
    )
    for module in staff_page_modules:
        if module.bp is not staff_console.bp:
            raise RuntimeError(f"{module.__name__} does not hang on the staff blueprint")
        for page in getattr(module, "PAGES", ()):
            register_page(page)
    app.register_blueprint(staff_console.bp)
    app.register_blueprint(feedback_views.bp)
    app.register_blueprint(receipts.bp)
    app.register_blueprint(openapi.bp)
    # The JSON API is same-origin and JSON-only (checked on every request), which a
    # cross-site form cannot forge; its callers include the service worker, which has
    # no page to read a CSRF token from.
    csrf.exempt(subscription_views.bp)
    csrf.exempt(consent_views.api)
    # Server to server: the digest's HMAC signature authenticates it, not a session.
    csrf.exempt(feedback_views.bp)
    csrf.exempt(receipts.bp)
    cli.register(app)
    consent_cli.register(cli.portal_cli)
    compliance_cli.register(cli.portal_cli)
    campaign_cli.register(cli.portal_cli)


def _instrument(app: Flask) -> None:
    from portal.metrics import http_latency, http_requests

    @app.before_request
    def _start_timer() -> None:
        g._portal_started = time.perf_counter()

    @app.after_request
    def _record(response: Response) -> Response:
        route = request.url_rule.rule if request.url_rule is not None else "unmatched"
        http_requests.labels(route, f"{response.status_code // 100}xx").inc()
        started = g.get("_portal_started")
        if started is not None:
            http_latency.labels(route).observe(time.perf_counter() - started)
        return response
