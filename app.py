"""The WSGI entry point: ``flask --app app run`` or ``gunicorn app:app``."""

from portal import create_app
from portal.config import ConfigError

try:
    app = create_app()
except ConfigError as error:
    raise SystemExit(f"portal: configuration error: {error}") from None
