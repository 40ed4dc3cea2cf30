"""The one outgoing-HTTP policy (fleetllm.adapters.outgoing), walked through every reconciler-side client that
carries a secret: the admin client (sync/suspend/pin/control and `rollout`), `import llmao --check`, the
metrics push and the notifier. Against a hostile server on loopback, each one: follows no redirect (the
other host sees nothing), uses no proxy from the environment, gives up at its deadline however slowly the
answer drips, and puts no secret in its error or any log line when the server echoes the request."""

from __future__ import annotations

import base64
import http.server
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from fleetllm.adapters.admin_client import AdminClient, control_plane_url
from fleetllm.adapters.llmao import fetched_source
from fleetllm.adapters.notify import Delivery, Notifier
from fleetllm.adapters.state.notifications import MemoryLedger
from fleetllm.core.notify import Event, EventKind, Target, TargetKind
from fleetllm.core.secret import Secret
from fleetllm.errors import FleetllmError
from fleetllm.job.pushmetrics import push_metrics
from fleetllm.settings import PushgatewayConfig
from tests.server.conftest import LogCapture, capturing_logs

TOKEN = "tok-Outgoing-9fK2mQ7x"
PATH_TOKEN = "pathtoken-Zr81Kd03"
USER, PASSWORD = "pushuser", "pw-Push-73hQk2Lm"
DEADLINE_S = 1.5


@dataclass
class Hostile:
    """A server that behaves as `mode` says and records what reached it."""

    mode: str = "ok"
    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    drip_done: threading.Event = field(default_factory=threading.Event)
    elsewhere: str = ""
    url: str = ""


def _handler(state: Hostile) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            state.seen.append((self.path, dict(self.headers.items())))
            echo = f"{self.path} {self.headers.get('Authorization')} {self.headers.get('X-Token')}"
            if state.mode == "redirect":
                self.send_response(302)
                self.send_header("Location", state.elsewhere + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif state.mode == "echo":
                body = f'{{"error": "bad request: {echo}", "detail": "{echo}"}}'.encode()
                self.send_response(400, f"Bad {echo}")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif state.mode == "drip":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "400")
                self.end_headers()
                try:
                    for _ in range(400):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        time.sleep(0.1)
                    state.drip_done.set()
                except OSError:
                    pass
            else:
                body = b'{"servers": []}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        do_GET = do_POST = do_PUT = _any  # noqa: N815

    return Handler


@contextmanager
def serving(state: Hostile) -> Iterator[Hostile]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def admin(url: str) -> str:
    try:
        AdminClient(control_plane_url(url, {}), Secret(TOKEN, "$T"), timeout_s=DEADLINE_S).call("GET", "/admin/control")
    except FleetllmError as exc:
        return str(exc)
    return "ok"


def llmao(url: str) -> str:
    return str(fetched_source(url, TOKEN, timeout_s=DEADLINE_S)("203.0.113.7"))


def pushgateway(url: str) -> str:
    target = PushgatewayConfig(Secret(f"{url}/{PATH_TOKEN}", "reconcile.pushgateway.url"), url, "i1",
                               Secret(USER, "u"), Secret(PASSWORD, "p"), DEADLINE_S)
    return push_metrics(CollectorRegistry(), target) or "ok"


def notifier(url: str) -> str:
    target = Target("ops", TargetKind.WEBHOOK, Secret(f"{url}/hook/{PATH_TOKEN}", "the url"),
                    frozenset(EventKind), Secret(TOKEN, "${env:B}"), ("X-Token", Secret(TOKEN, "${env:H}")))
    sender = Notifier([target], Delivery(3600.0, DEADLINE_S, 1, 10, True), MemoryLedger(), component="test",
                      instance="test", registry=CollectorRegistry())
    sender.emit(Event(EventKind.ROLLOUT_HALTED, "r-1", "halted"))
    assert sender.close(30)
    return "sent"


CLIENTS: dict[str, Callable[[str], str]] = {"admin": admin, "llmao": llmao, "pushgateway": pushgateway,
                                            "notifier": notifier}
SECRETS = (TOKEN, PATH_TOKEN, PASSWORD, base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())


@pytest.fixture
def logs() -> Iterator[LogCapture]:
    with capturing_logs(logging.DEBUG) as capture:  # the push's success line is DEBUG
        yield capture


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_no_redirect_is_followed(client: str) -> None:
    with serving(Hostile()) as other, serving(Hostile("redirect")) as first:
        first.elsewhere = other.url
        CLIENTS[client](first.url)
        assert first.seen and other.seen == []


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_no_proxy_from_the_environment(client: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with serving(Hostile()) as proxy, serving(Hostile()) as target:
        for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
            monkeypatch.setenv(name, proxy.url)
        for name in ("no_proxy", "NO_PROXY"):
            monkeypatch.delenv(name, raising=False)
        CLIENTS[client](target.url)
        assert proxy.seen == [] and target.seen


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_an_echoed_secret_reaches_no_message_and_no_log_line(client: str, logs: LogCapture) -> None:
    with serving(Hostile("echo")) as hostile:
        outcome = CLIENTS[client](hostile.url)
        assert hostile.seen
    text = outcome + logs.stream.getvalue()
    assert [s for s in SECRETS if s in text] == []


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_dripping_answer_is_cut_at_the_deadline(client: str) -> None:
    with serving(Hostile("drip")) as hostile:
        outcome = CLIENTS[client](hostile.url)
        assert hostile.seen and not hostile.drip_done.is_set()  # the client gave up long before the drip ended
    assert outcome != "ok"


@pytest.mark.parametrize("url", ["http://198.51.100.7:8080", "http://cp.example", "ftp://127.0.0.1/"])
def test_plain_http_off_loopback_is_refused_before_sending(url: str) -> None:
    assert "https" in admin(url)
    with pytest.raises(ValueError, match="https"):
        fetched_source(url, TOKEN)
