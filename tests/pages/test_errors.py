"""Errors on the status pages are pages (HTML, the pages' security headers, no traceback, no secret);
the same errors on the API are JSON; a refusal on a page sends the browser to log in."""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient

from fleetllm.errors import StateError
from fleetllm.server.pages import routes
from tests.pages.conftest import World, csrf_of
from tests.server.conftest import SECRETS, LogCapture

BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


def assert_html_error(response: object, status: int) -> str:
    from werkzeug.test import TestResponse

    assert isinstance(response, TestResponse)
    assert response.status_code == status
    assert response.mimetype == "text/html"
    assert response.headers["X-Frame-Options"] == "DENY" and "default-src 'none'" in response.headers[
        "Content-Security-Policy"]
    assert response.headers["Cache-Control"] == "no-store"
    text = response.get_data(as_text=True)
    assert f"<h2>{status} " in text
    assert "Traceback" not in text and not any(secret in text for secret in SECRETS)
    return text


def test_unknown_paths_are_json_unless_a_browser_asks(viewer: FlaskClient) -> None:
    assert viewer.get("/nope").get_json()["error"]  # scripts (and tests/server) get JSON
    assert_html_error(viewer.get("/nope", headers=BROWSER), 404)
    assert viewer.get("/api/nope", headers={"Accept": "application/json"}).get_json()["error"]


def test_a_wrong_method_on_a_page_is_a_page(viewer: FlaskClient) -> None:
    response = viewer.post("/models")
    assert_html_error(response, 405)
    assert "GET" in response.headers["Allow"]
    assert viewer.delete("/api/models").get_json()["error"]  # the API's stays JSON


def test_an_oversized_form_is_a_page(world: World) -> None:
    client = world.app.test_client()
    csrf = csrf_of(client.get("/login").get_data(as_text=True))
    response = client.post("/login", data={"csrf": csrf, "token": "x" * (routes.MAX_FORM_BYTES + 1)})
    assert_html_error(response, 413)


@pytest.mark.parametrize(("failure", "status"), [(RuntimeError, 500), (StateError, 503)])
def test_failures_are_pages_on_pages_and_json_on_the_api(viewer: FlaskClient, logs: LogCapture,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        failure: type[Exception], status: int) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise failure(f"details that stay in the server: {SECRETS[0]}")

    monkeypatch.setattr(routes, "fleet_view", broken)
    text = assert_html_error(viewer.get("/"), status)
    assert "details that stay" not in text
    api = viewer.get("/api/fleet")
    assert api.status_code == status and list(api.get_json()) == ["error"]
    assert "details that stay" not in api.get_data(as_text=True)
    if failure is RuntimeError:  # logged by type only
        assert [e["error"] for e in logs.events("unhandled error")] == ["RuntimeError", "RuntimeError"]
        assert SECRETS[0] not in logs.text


def test_a_refused_page_asks_to_log_in_and_the_api_says_so(world: World) -> None:
    stranger = world.app.test_client()
    page = stranger.get("/revision?fragment=1")
    assert (page.status_code, page.headers["Location"]) == (302, "/login?next=/revision")
    approve = stranger.post("/approve", data={"host": "x", "model": "y"})
    assert (approve.status_code, approve.headers["Location"]) == (302, "/login")
    api = stranger.get("/api/revision")
    assert api.status_code == 401 and api.headers["WWW-Authenticate"] == 'Bearer realm="fleetllm"'
    assert api.get_json() == {"error": "a viewer, operator or admin token is required: send Authorization: Bearer <token>, "
                                       "or log in at /login"}
