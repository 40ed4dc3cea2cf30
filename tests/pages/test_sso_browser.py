"""Single sign-on end to end: Debian's Chromium (headless, driven by Playwright) against the real
`fleetllm serve` and a real OpenID Connect provider, `oidc-provider-mock` (PyPI), each its own process
on loopback. The provider listens on 127.0.0.2 and the control plane on 127.0.0.1: two sites, so the
browser treats the provider's redirects as cross-site, as it does in production.

- An operator (group fleet-operators) signs in through the provider, pauses the staged rollout on the
  Revision page, and the audit trail and the rollout name her ("alice <alice@example.com>"); her
  cookie holds no token. Logging out ends the session (the old cookie then gets the login page and a
  401), and sends her to the provider's end-session page, which brings her back to /login.
- A viewer (fleet-viewers) sees no control and is refused when posting one anyway; once the provider
  moves him to fleet-operators, his current session keeps its role and his next login is an operator.
- Someone in no mapped group is refused at login, saying so.
- Forgeries: a callback with another state, a session cookie edited to claim admin, and bearer JWTs
  (a real ID token passes; its payload altered, another client's token, a self-signed one do not).
- Expiry: against a provider whose tokens last TOKEN_S seconds, the session ends with the ID token.

Marked integration: with FLEETLLM_REQUIRE_INTEGRATION=1 (CI) a missing Chromium or provider fails the
run instead of skipping it.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetllm.adapters.state import open_store
from fleetllm.core.rollout.model import Rollout, RolloutState
from fleetllm.demo.procs import stop
from tests.conftest import git
from tests.pages.chromium import NEEDS_CHROMIUM, wait_for
from tests.pages.scenario import make_repo
from tests.server.conftest import ADMIN_TOKEN, ENV, SECRETS, VIEWER_TOKEN, base_config, write_config
from tests.support.ports import free_ports

pytestmark = NEEDS_CHROMIUM

PROVIDER_HOST = "127.0.0.2"  # another site than the control plane's 127.0.0.1
CLIENT_ID = "fleetllm-e2e"
CLIENT_SECRET = "oidc-client-secret-for-e2e-0123456789"
ROLES = {"fleet-viewers": "viewer", "fleet-operators": "operator", "fleet-admins": "admin"}
TOKEN_S = 10  # the short-lived provider's ID tokens (the expiry test)
USERS = {
    "alice": {"email": "alice@example.com", "name": "Alice Operator", "groups": ["staff", "fleet-operators"]},
    "victor": {"email": "victor@example.com", "name": "Victor Viewer", "groups": ["fleet-viewers"]},
    "mallory": {"email": "mallory@example.com", "name": "Mallory", "groups": ["staff"]},
}


def http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         *, follow: bool = True) -> tuple[int, bytes, dict[str, str]]:
    handlers = [] if follow else [NoRedirect()]
    opener = urllib.request.build_opener(*handlers)
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with opener.open(request, timeout=15) as response:
            return response.status, response.read(), {k.title(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), {k.title(): v for k, v in exc.headers.items()}


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def answers(url: str) -> bool:
    try:
        return http("GET", url)[0] == 200
    except OSError:
        return False


@dataclass
class Provider:
    url: str
    log: Path

    def set_user(self, sub: str, claims: dict[str, Any]) -> None:
        status, body, _ = http("PUT", f"{self.url}/users/{sub}", json.dumps(claims).encode(),
                               {"Content-Type": "application/json"})
        assert status == 204, body

    def id_token(self, sub: str, client_id: str = CLIENT_ID, redirect: str = "http://127.0.0.1:1/cb") -> str:
        """The authorization-code flow over plain HTTP (what a CLI's OIDC login does): an ID token."""
        query = urllib.parse.urlencode({"client_id": client_id, "redirect_uri": redirect, "response_type": "code",
                                        "scope": "openid email profile", "state": "s", "nonce": "n"})
        status, _, headers = http("POST", f"{self.url}/oauth2/authorize?{query}",
                                  urllib.parse.urlencode({"sub": sub}).encode(),
                                  {"Content-Type": "application/x-www-form-urlencoded"}, follow=False)
        assert status == 302, status
        code = urllib.parse.parse_qs(urllib.parse.urlsplit(headers["Location"]).query)["code"][0]
        status, body, _ = http("POST", f"{self.url}/oauth2/token", urllib.parse.urlencode({
            "grant_type": "authorization_code", "code": code, "redirect_uri": redirect, "client_id": client_id,
            "client_secret": CLIENT_SECRET}).encode(), {"Content-Type": "application/x-www-form-urlencoded"})
        assert status == 200, body
        return str(json.loads(body)["id_token"])


def start_provider(root: Path, name: str, *extra: str) -> tuple[subprocess.Popen[bytes], Provider]:
    pytest.importorskip("oidc_provider_mock", reason="oidc-provider-mock is not installed: pip install -e '.[dev]'")
    (port,) = free_ports(PROVIDER_HOST)
    log_path = root / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "oidc_provider_mock", "--host", PROVIDER_HOST, "--port",
                                    str(port), "--require-nonce", "true", *extra], stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    provider = Provider(f"http://{PROVIDER_HOST}:{port}", log_path)
    try:
        wait_for("the OIDC provider", timeout=60, check=lambda: process.poll() is not None
                 or answers(f"{provider.url}/.well-known/openid-configuration"))
        assert process.poll() is None, log_path.read_text()
        for sub, claims in USERS.items():
            provider.set_user(sub, claims)
    except BaseException:
        stop(process, timeout_s=10)
        raise
    return process, provider


@dataclass
class Plane:
    url: str
    state: Path
    log: Path
    revision: str


def start_plane(root: Path, repo: Path, provider: Provider, name: str) -> tuple[subprocess.Popen[bytes], Plane]:
    (port,) = free_ports("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    state = root / f"{name}.sqlite3"
    revision = git(repo, "rev-parse", "HEAD")
    store = open_store(f"sqlite:///{state}")  # a staged rollout under way, as the reconciler leaves one
    try:
        store.save_rollout(Rollout(revision, RolloutState.RUNNING, time.time(), time.time(), waves=1), {})
    finally:
        store.close()
    document = {**base_config(repo, state), "reconcile": {"enabled": False},
                "auth": {"oidc": {"issuer": provider.url, "client_id": CLIENT_ID, "client_secret": "${env:OIDC}",
                                  "redirect_base": url, "roles": ROLES, "accept_bearer_jwts": True}}}
    config = write_config(root / f"{name}.yaml", document)
    log_path = root / f"{name}-serve.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "fleetllm", "serve", "--config", str(config), "--listen",
                                    f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, **ENV, "OIDC": CLIENT_SECRET}, start_new_session=True)
    try:
        wait_for("fleetllm serve", lambda: process.poll() is not None or answers(f"{url}/health"), timeout=60)
        assert process.poll() is None, log_path.read_text()
    except BaseException:
        stop(process, timeout_s=15)
        raise
    return process, Plane(url, state, log_path, revision)


@dataclass
class World:
    provider: Provider
    plane: Plane
    short_provider: Provider  # its tokens last TOKEN_S seconds
    short_plane: Plane


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("sso")
    repo = root / "fleet"
    make_repo(repo)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        process, provider = start_provider(root, "provider")
        processes.append(process)
        process, short_provider = start_provider(root, "short-provider", "--token-max-age", str(TOKEN_S))
        processes.append(process)
        process, plane = start_plane(root, repo, provider, "plane")
        processes.append(process)
        process, short_plane = start_plane(root, repo, short_provider, "short-plane")
        processes.append(process)
        yield World(provider, plane, short_provider, short_plane)
        for log in (plane.log, short_plane.log):  # no secret, code or token in what the control plane logged
            text = log.read_text()
            assert CLIENT_SECRET not in text and not any(secret in text for secret in SECRETS)
            assert "code=" not in text and "eyJ" not in text  # no authorization code, no JWT
    finally:
        for process in reversed(processes):
            stop(process, timeout_s=15)


@pytest.fixture
def new_page(browser: Any, world: World) -> Iterator[Any]:
    """Pages in fresh browser contexts that may reach the control planes and the providers only."""
    contexts: list[Any] = []
    allowed = (world.plane.url, world.provider.url, world.short_plane.url, world.short_provider.url)

    def make() -> Any:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.route("**/*", lambda r: r.continue_() if r.request.url.startswith(allowed) else r.abort())
        contexts.append(context)
        return context.new_page()

    yield make
    for context in contexts:
        context.close()


def sign_in(page: Any, plane: Plane, provider: Provider, sub: str, path: str = "/") -> None:
    """From a page of the control plane to the provider's form, as `sub`, and back to `path`, signed in."""
    page.goto(f"{plane.url}{path}")
    assert page.url.startswith(f"{plane.url}/login?next=")
    page.click("#sso")
    page.wait_for_url(f"{provider.url}/oauth2/authorize?**")
    page.fill("input[name=sub]", sub)
    page.click("button:has-text('Authorize')")
    page.wait_for_url(f"{plane.url}{path}")


def session_of(page: Any) -> dict[str, Any]:
    """The session cookie's content (Flask signs it; it is not encrypted, so it must hold nothing secret)."""
    value = next(c["value"] for c in page.context.cookies() if c["name"] == "fleetllm_session")
    compressed = value.startswith(".")
    payload = value.lstrip(".").split(".")[0]
    raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    return dict(json.loads(zlib.decompress(raw) if compressed else raw))


def admin_audit(plane: Plane) -> list[dict[str, Any]]:
    status, body, _ = http("GET", f"{plane.url}/admin/control", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert status == 200, body
    return list(json.loads(body)["audit"])


def post_form(page: Any, path: str) -> None:
    """What a hand-made request from the signed-in page would do: post the action with the page's CSRF token."""
    page.evaluate("""async (path) => {
        const csrf = document.querySelector('input[name=csrf]').value;
        await fetch(path, {method: 'POST', body: new URLSearchParams({csrf, next: '/revision'}), redirect: 'manual'});
    }""", path)


def test_an_operator_signs_in_pauses_the_rollout_and_the_trail_names_her(world: World, new_page: Any) -> None:
    plane, provider = world.plane, world.provider
    page = new_page()
    sign_in(page, plane, provider, "alice", "/revision")
    assert page.locator("header .person").inner_text().startswith("Alice Operator")
    assert "operator" in page.locator("header .person").inner_text()
    cookie = next(c for c in page.context.cookies() if c["name"] == "fleetllm_session")
    assert (cookie["secure"], cookie["httpOnly"], cookie["sameSite"]) == (True, True, "Strict")
    held = session_of(page)
    assert (held["sub"], held["email"], held["role"]) == ("alice", "alice@example.com", "operator")
    assert not any("eyJ" in str(v) for v in held.values())  # no ID or access token in the cookie
    assert "fleetllm_sso" not in {c["name"] for c in page.context.cookies()}  # the sign-on's cookie is gone

    page.click("[data-rollout-forms] form[data-action=pause] button")
    page.wait_for_load_state()
    assert "Pause requested" in page.locator(".flash").inner_text()
    assert "Pause requested by alice <alice@example.com>" in page.locator("#rollout + p").inner_text()
    page.locator(".control-log summary").click()
    entry = page.locator('.control-log li[data-action="rollout-pause"]')
    assert "by alice <alice@example.com>" in entry.inner_text()
    newest = admin_audit(plane)[0]
    assert (newest["action"], newest["actor"], newest["revision"]) == (
        "rollout-pause", "alice <alice@example.com>", plane.revision)

    # logout ends the session here (a copy of the cookie no longer works), then at the provider
    old = next(c for c in page.context.cookies() if c["name"] == "fleetllm_session")
    page.click("header form.who button")
    page.wait_for_url(f"{provider.url}/oauth2/end_session?**")
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(page.url).query)
    assert query == {"client_id": [CLIENT_ID], "post_logout_redirect_uri": [f"{plane.url}/login"]}
    page.click("button:has-text('End session')")
    page.wait_for_url(f"{plane.url}/login")
    replay = new_page()
    replay.context.add_cookies([old])
    replay.goto(f"{plane.url}/revision")
    assert replay.url.startswith(f"{plane.url}/login?next=")
    status, _, _ = http("GET", f"{plane.url}/api/fleet", headers={"Cookie": f"fleetllm_session={old['value']}"})
    assert status == 401


def test_a_viewer_cannot_and_a_group_change_takes_effect_at_the_next_login(world: World, new_page: Any) -> None:
    plane, provider = world.plane, world.provider
    page = new_page()
    sign_in(page, plane, provider, "victor", "/revision")
    assert "viewer" in page.locator("header .person").inner_text()
    assert page.locator("[data-rollout-forms]").count() == 0 and page.locator(".control-forms").count() == 0
    before = len(admin_audit(plane))
    post_form(page, "/control/rollout/abort")
    post_form(page, "/control/suspend")
    page.reload()
    assert "needs an operator or admin" in page.locator(".flash").first.inner_text()
    assert len(admin_audit(plane)) == before  # nothing was done in his name

    provider.set_user("victor", {**USERS["victor"], "groups": ["fleet-viewers", "fleet-operators"]})
    page.reload()  # the session keeps the role of its login
    assert "viewer" in page.locator("header .person").inner_text()
    assert page.locator("[data-rollout-forms]").count() == 0
    page.click("header form.who button")
    page.wait_for_url(f"{provider.url}/oauth2/end_session?**")
    page.click("button:has-text('End session')")
    page.wait_for_url(f"{plane.url}/login")
    sign_in(page, plane, provider, "victor", "/revision")
    assert "operator" in page.locator("header .person").inner_text()
    assert page.locator("[data-rollout-forms]").count() == 1
    provider.set_user("victor", USERS["victor"])


def test_someone_in_no_mapped_group_is_refused_saying_why(world: World, new_page: Any) -> None:
    plane, provider = world.plane, world.provider
    page = new_page()
    page.goto(f"{plane.url}/")
    page.click("#sso")
    page.wait_for_url(f"{provider.url}/oauth2/authorize?**")
    page.fill("input[name=sub]", "mallory")
    page.click("button:has-text('Authorize')")
    page.wait_for_url(f"{plane.url}/oidc/callback?**")
    problem = page.locator(".flash").inner_text()
    assert "You signed in as mallory <mallory@example.com>, but none of your groups (staff)" in problem
    assert "fleetllm_session" not in {c["name"] for c in page.context.cookies()} or \
        not session_of(page).get("role")


def test_forged_answers_cookies_and_tokens_are_refused(world: World, new_page: Any) -> None:
    plane, provider = world.plane, world.provider
    page = new_page()
    page.goto(f"{plane.url}/login/oidc?next=/")  # a sign-on under way in this browser...
    page.wait_for_url(f"{provider.url}/oauth2/authorize?**")
    page.goto(f"{plane.url}/oidc/callback?code=stolen-code&state=forged-state")  # ...answered by someone else
    assert "state does not match" in page.locator(".flash").inner_text()
    fresh = new_page()
    fresh.goto(f"{plane.url}/oidc/callback?code=stolen-code&state=forged-state")
    assert "expired or was started in another browser" in fresh.locator(".flash").inner_text()

    signed = new_page()
    sign_in(signed, plane, provider, "victor")
    value = next(c for c in signed.context.cookies() if c["name"] == "fleetllm_session")
    claims = session_of(signed)
    edited = base64.urlsafe_b64encode(json.dumps({**claims, "role": "admin"}).encode()).rstrip(b"=").decode()
    forged = {**value, "value": ".".join([edited, *value["value"].lstrip(".").split(".")[1:]])}
    liar = new_page()
    liar.context.add_cookies([forged])
    liar.goto(f"{plane.url}/revision")
    assert liar.url.startswith(f"{plane.url}/login?next=")

    real = provider.id_token("alice")
    def call(token: str) -> tuple[int, dict[str, Any]]:
        status, body, _ = http("POST", f"{plane.url}/admin/sync", b"{}", {"Authorization": f"Bearer {token}",
                                                                         "Content-Type": "application/json"})
        return status, json.loads(body)
    status, answer = call(real)
    assert status == 202, answer
    assert admin_audit(plane)[0]["actor"] == "alice <alice@example.com>"
    header, payload, signature = real.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    promoted = base64.urlsafe_b64encode(json.dumps({**claims, "sub": "mallory"}).encode()).rstrip(b"=").decode()
    status, answer = call(f"{header}.{promoted}.{signature}")
    assert (status, answer["error"]) == (403, f"the bearer token's signature does not verify against the keys of "
                                              f"{provider.url}: it was forged or altered")
    status, answer = call(provider.id_token("alice", client_id="another-client"))
    assert status == 403 and "issued to another client" in answer["error"]
    status, answer = call(world.short_provider.id_token("alice"))  # right shape, another provider's keys
    assert status == 403 and ("does not publish" in answer["error"] or "forged or altered" in answer["error"])
    assert VIEWER_TOKEN not in json.dumps(answer) and real not in plane.log.read_text()


def test_the_session_ends_when_the_id_token_expires(world: World, new_page: Any) -> None:
    plane, provider = world.short_plane, world.short_provider
    page = new_page()
    sign_in(page, plane, provider, "alice")
    held = session_of(page)
    assert held["exp"] - held["at"] <= TOKEN_S  # the ID token's lifetime, not the session's 12 hours
    cookie = next(c for c in page.context.cookies() if c["name"] == "fleetllm_session")

    def signed_out() -> bool:
        page.goto(f"{plane.url}/")
        return bool(page.url.startswith(f"{plane.url}/login?next="))

    wait_for("the session to end with its ID token", signed_out, timeout=TOKEN_S * 6)
    status, _, _ = http("GET", f"{plane.url}/api/fleet", headers={"Cookie": f"fleetllm_session={cookie['value']}"})
    assert status == 401
