"""``create_app(settings)``: the Flask application with the API, login and dashboards."""

from __future__ import annotations

import logging
from datetime import timedelta

from flask import Flask

from agentledger.agent_kinds.served_memory import ServedMemory
from agentledger.core.config import Settings
from agentledger.core.database import Database
from agentledger.core.notifier import EventNotifier
from agentledger.web.app_state import AppState
from agentledger.web.cookie_session import CookieSessionInterface
from agentledger.web.security import install_security


def create_app(
    settings: Settings | None = None,
    *,
    database: Database | None = None,
    dashboards: bool = True,
) -> Flask:
    """Build the app. Background work (worker, reconciler) is started by ``server``, not here,
    so tests and WSGI servers can create apps freely."""
    settings = settings or Settings.from_env()
    db = database or Database.from_settings(settings)
    app = Flask("agentledger")
    app.config.update(
        SECRET_KEY=settings.resolved_secret_key(),
        MAX_CONTENT_LENGTH=settings.max_body_bytes,
        SESSION_COOKIE_NAME="agentledger_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        # Secure when served over HTTPS (behind a TLS proxy set AGENTLEDGER_SECURE_COOKIES=1).
        SESSION_COOKIE_SECURE=settings.secure_cookies,
        PERMANENT_SESSION_LIFETIME=timedelta(hours=12),
        JSON_SORT_KEYS=False,
    )
    app.json.sort_keys = False
    app.session_interface = CookieSessionInterface()
    notifier = EventNotifier(db.url, is_postgres=db.is_postgres,
                             poll_seconds=settings.sse_poll_seconds)
    notifier.hear_commits_of(db)
    app.extensions["agentledger"] = AppState(settings=settings, db=db, notifier=notifier,
                                             memory=ServedMemory(db.url))

    from agentledger.api import blueprint
    from agentledger.web.error_envelope import register_error_handlers
    from agentledger.web.login import web_auth
    from agentledger.web.metrics import install_metrics, start_request_clock_first

    app.register_blueprint(blueprint)
    app.register_blueprint(web_auth)
    install_metrics(app)
    register_error_handlers(app)
    from agentledger.web.request_limits import refuse_oversized

    app.before_request(refuse_oversized)
    if dashboards:
        try:
            from dashboards import mount_dashboards
        except ModuleNotFoundError as exc:  # pragma: no cover - installed without dashboards
            if exc.name != "dashboards":
                raise  # a broken dashboards package must fail loudly, not vanish
            logging.getLogger("agentledger").info("dashboards package not available")
        else:
            mount_dashboards(app)
    install_security(app)
    # First of all hooks: every read of the request, the caller's look-up included, shares
    # one replica-or-primary decision (``Database.begin_read_scope``).
    app.before_request_funcs.setdefault(None, []).insert(0, db.begin_read_scope)
    app.teardown_request(lambda _exc: db.end_read_scope())
    start_request_clock_first(app)
    return app
