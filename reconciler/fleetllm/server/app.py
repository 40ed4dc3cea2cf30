"""The Flask application factory: `create_app(runtime)` keeps the Runtime on the app and registers the
blueprints, each defined at module level:

    health      GET /health, GET /metrics                               (public)
    box         GET /vllm/config, POST /vllm/report, GET /vllm/installer,  (the fleet key: the box contract)
                GET /vllm/gateway-native/<tag>
    admin       POST /hooks/push, /admin/*                              (webhook signature; a bearer of a role)
    control     /admin/control, sync, suspend, resume, pin, unpin       (viewer; operator; control_api.py)
    rollout     /admin/rollout, pause, resume, abort                    (viewer; operator; rollout_api.py)
    pages       the status pages, their /api/*, login, single sign-on   (a role: session or bearer)
    errors      every error answer, JSON or HTML by surface

Views reach the runtime with `current_runtime()` and are guarded by `requires(role)` (access.py).
"""

from __future__ import annotations

from flask import Flask

from fleetllm.server import admin_api, box_api, control_api, errors, health, rollout_api
from fleetllm.server.pages import control as page_controls  # noqa: F401 (adds the pages' control forms)
from fleetllm.server.pages import routes as pages
from fleetllm.server.pages import sso  # noqa: F401 (adds single sign-on's /login/oidc and /oidc/callback)
from fleetllm.server.runtime import EXTENSION, Runtime


def create_app(rt: Runtime) -> Flask:
    app = Flask("fleetllm", static_folder=None)  # no /static from the working directory; pages ship their own
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions[EXTENSION] = rt  # before the blueprints: the pages' set-up reads the config from it
    for blueprint in (health.bp, box_api.bp, admin_api.bp, control_api.bp, rollout_api.bp, pages.bp, errors.bp):
        app.register_blueprint(blueprint)
    return app
