"""The dashboards of CONTRACT §6: a Dash multi-page app mounted on the agentledger Flask server.

``mount_dashboards(server)`` installs the login guard (``agentledger.web.access``) for every non-API
path, creates the Dash app on the same server (pages under ``dashboards/pages``, one theme,
debug tools off) and registers the pages' callbacks. Pages hold layout and callbacks only: they
parse inputs, call ``queries``, and hand plain data to ``dashboards.figures``. Nothing here
imports the write path or a database driver (an import-linter contract checks it).
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from pathlib import Path

import dash
import dash_bootstrap_components as dbc
from dash import Dash, html
from flask import Flask, has_request_context, request

from agentledger.web import access
from agentledger.web.principal import current_principal
from dashboards import page_registry as registry
from dashboards.callback_requests import check_callback_request
from dashboards.components import navbar

ASSETS = Path(__file__).parent / "assets"
_pages_loaded = False


def _load_pages() -> None:
    """Import every page module once per process (each registers itself with Dash)."""
    global _pages_loaded
    if _pages_loaded:
        return
    from dashboards import pages

    for module in pkgutil.iter_modules(pages.__path__):
        importlib.import_module(f"dashboards.pages.{module.name}")
    _pages_loaded = True


def shell() -> html.Div:
    """The frame around every page: the nav bar (with who is logged in) and the page."""
    principal = current_principal() if has_request_context() else None
    return html.Div([
        navbar(principal.owner_id if principal else None, principal.role if principal else None),
        dbc.Container(dash.page_container, fluid=True, className="pb-5"),
    ])


class _LockedSetupDash(Dash):
    """Dash, with its first-request setup run once under a lock, and malformed callback
    requests refused before Dash reads them.

    Dash sets its server up on the first request (a ``before_request`` hook of the whole
    server, API routes included) behind a flag that it checks and sets without a lock. Two
    first requests of a fresh worker at once both ran it, and one failed with a 500
    ("dictionary changed size during iteration") while the other filled the callback map. Here
    a request that arrives during the setup waits for it to finish."""

    def __init__(self, *args, **kwargs):
        self._setup_lock = threading.Lock()
        self._setup_done = False
        super().__init__(*args, **kwargs)

    def _setup_server(self):
        if self._setup_done:
            return
        with self._setup_lock:
            if not self._setup_done:
                super()._setup_server()
                self._setup_done = True

    def dispatch(self):
        # A body Dash cannot read is the client's mistake: 400 with the JSON envelope
        # (``InvalidRequest``), not a 500 and a traceback from inside Dash.
        check_callback_request(request.get_json(silent=True), self.callback_map)
        return super().dispatch()


def mount_dashboards(server: Flask) -> Dash:
    # The guard goes first, so no Dash hook or view runs for a caller who may not see them.
    server.before_request(access.guard)
    app = _LockedSetupDash(
        "dashboards",
        server=server,
        url_base_pathname="/",
        use_pages=True,
        pages_folder="",  # page modules are imported by _load_pages, once per process
        assets_folder=str(ASSETS),
        title="agentledger",
        update_title=None,
        serve_locally=True,
        use_async=False,
        suppress_callback_exceptions=False,
    )
    # Production settings whatever DASH_* variables say: no debug UI or props check, no hot
    # reload, and no call home to check for a newer Dash.
    app.enable_dev_tools(debug=False, dev_tools_ui=False, dev_tools_props_check=False,
                         dev_tools_serve_dev_bundles=False, dev_tools_hot_reload=False,
                         dev_tools_silence_routes_logging=False,
                         dev_tools_disable_version_check=True, dev_tools_prune_errors=True)
    _load_pages()
    registry.register_all(app)
    app.layout = shell
    server.extensions["agentledger_dash"] = app
    return app
