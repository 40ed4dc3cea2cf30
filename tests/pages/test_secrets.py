"""Nothing any page, fragment, API answer, header or log line shows holds a secret: the fleet key, the
salt, a derived bearer, the legacy key, the LiteLLM master key, the webhook secret or a token."""

from __future__ import annotations

from flask.testing import FlaskClient

from fleetllm.core.fleet.bearer import Salt
from tests.conftest import TEST_SALT
from tests.pages.conftest import PAGE_SECRETS, LogCapture, World, csrf_of, login
from tests.pages.scenario import UNKNOWN_BOX
from tests.server.conftest import ADMIN_TOKEN, VIEWER_TOKEN

PATHS = ("/", "/models", "/revision", "/history", "/?fragment=1", "/models?fragment=1", "/revision?fragment=1",
         "/history?fragment=1", "/api/fleet", "/api/models", "/api/attention", "/api/revision", "/api/passes",
         "/api/openapi.yaml", "/login", "/pages/static/pages.js", "/pages/static/pages.css")


def secrets_of(world: World) -> list[str]:
    served = world.runtime.tracker.served
    assert served is not None
    salt = Salt(TEST_SALT)
    bearers = [salt.derive(box.name, row.port) for box in served.fleet.boxes.values() for row in box.servers]
    return [*PAGE_SECRETS, *bearers, salt.derive(UNKNOWN_BOX, world.ports[0])]


def everything_shown(client: FlaskClient) -> str:
    shown = []
    for path in PATHS:
        response = client.get(path)
        assert response.status_code in (200, 302, 401), path
        shown.append(response.get_data(as_text=True))
        shown.extend(f"{k}: {v}" for k, v in response.headers.items())
    return "\n".join(shown)


def test_no_secret_on_any_page_or_api(world: World, logs: LogCapture) -> None:
    secrets = secrets_of(world)
    assert len(secrets) > 10
    viewer, admin = world.app.test_client(), world.app.test_client()
    shown = [everything_shown(world.app.test_client())]  # before login: the login form and redirects
    for client, token in ((viewer, VIEWER_TOKEN), (admin, ADMIN_TOKEN)):
        response = login(client, token)
        shown.append("\n".join(f"{k}: {v}" for k, v in response.headers.items()))
        shown.append(everything_shown(client))
    # a refused approval's message, and a refused login
    csrf = csrf_of(admin.get("/").get_data(as_text=True))
    admin.post("/approve", data={"csrf": csrf, "host": UNKNOWN_BOX, "model": "tiny-a"})
    shown.append(admin.get("/").get_data(as_text=True))
    refused = world.app.test_client()
    refused_csrf = csrf_of(refused.get("/login").get_data(as_text=True))
    shown.append(refused.post("/login", data={"token": ADMIN_TOKEN[:-1], "csrf": refused_csrf}).get_data(as_text=True))
    shown.append(logs.text)
    text = "\n".join(shown)
    assert "Healthy" in text and "Needs attention" in text and "was not approved" in text  # it did look
    for secret in secrets:
        assert secret not in text, f"a secret ({secret[:6]}…) is shown"
