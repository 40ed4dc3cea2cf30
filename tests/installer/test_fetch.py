"""The control-plane client against a real HTTP(S) server on loopback that follows the contract."""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme

from fleetllm_installer.fetch import CAP_S, Client, FetchError, check_url
from tests.installer.conftest import BOX, FLEET_KEY, FakeControlPlane, free_port


class FakeTime:
    """Injected sleep and clock: retries are checked by the delays asked for, never by waiting."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.on_sleep: Any = None

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep()
            self.on_sleep = None

    def clock(self) -> float:
        return self.now


def client(url: str, time: FakeTime, *, key: str = FLEET_KEY, host: str = BOX, deadline: float = 600,
           ca: Path | None = None) -> Client:
    return Client(url, key, host, ca, deadline_s=deadline, sleep=time.sleep, clock=time.clock,
                  jitter=lambda low, high: high)  # the jitter's upper bound: deterministic delays


def test_fetch_sends_the_contract_headers(control_plane: FakeControlPlane, box_json: dict[str, Any]) -> None:
    data = client(control_plane.url, FakeTime()).fetch_config()
    assert json.loads(data) == box_json
    (request,) = control_plane.requests
    assert request["headers"]["authorization"] == f"Bearer {FLEET_KEY}"
    assert request["headers"]["x-llmao-host"] == BOX
    assert request["headers"]["accept"] == "application/json"


def test_wrong_fleet_key_fails_at_once(control_plane: FakeControlPlane) -> None:
    time = FakeTime()
    with pytest.raises(FetchError, match=r"refused the fleet key \(403\).*FLEETLLM_FLEET_KEY"):
        client(control_plane.url, time, key="wrong-key").fetch_config()
    assert time.sleeps == []
    assert len(control_plane.requests) == 1


def test_unknown_box_fails_at_once(control_plane: FakeControlPlane) -> None:
    with pytest.raises(FetchError, match=r"does not know the box 'box-z' \(404\).*placement.yaml.*LLMAO_HOST"):
        client(control_plane.url, FakeTime(), host="box-z").fetch_config()
    assert len(control_plane.requests) == 1


def test_5xx_is_retried_with_exponential_backoff(control_plane: FakeControlPlane) -> None:
    control_plane.script = [503, 500, 502]
    time = FakeTime()
    assert json.loads(client(control_plane.url, time).fetch_config())["host"] == BOX
    assert time.sleeps == [1.0, 2.0, 4.0]
    assert len(control_plane.requests) == 4


def test_429_waits_at_least_retry_after(control_plane: FakeControlPlane) -> None:
    control_plane.script = [429]
    time = FakeTime()
    client(control_plane.url, time).fetch_config()
    assert time.sleeps == [7.0]


def test_backoff_is_capped_and_jittered(control_plane: FakeControlPlane) -> None:
    control_plane.script = [503] * 9
    time = FakeTime()
    picks: list[tuple[float, float]] = []
    jittered = Client(control_plane.url, FLEET_KEY, BOX, sleep=time.sleep, clock=time.clock,
                      jitter=lambda low, high: picks.append((low, high)) or high / 2)
    jittered.fetch_config()
    assert [high for _, high in picks] == [1, 2, 4, 8, 16, 32, CAP_S, CAP_S, CAP_S]
    assert all(low == 0 for low, _ in picks)
    assert time.sleeps == [high / 2 for _, high in picks]


def test_connection_refused_then_up(box_json: dict[str, Any]) -> None:
    port = free_port()
    plane = FakeControlPlane({BOX: box_json}, port=port)
    time = FakeTime()
    time.on_sleep = plane.start  # the control plane comes up while the box waits
    try:
        data = client(f"http://127.0.0.1:{port}", time).fetch_config()
    finally:
        plane.stop()
    assert json.loads(data) == box_json
    assert time.sleeps == [1.0]


def test_retries_stop_at_the_deadline(control_plane: FakeControlPlane) -> None:
    control_plane.script = [503] * 50
    time = FakeTime()
    with pytest.raises(FetchError, match=r"answered 503 \(gave up after 5 attempts\)"):
        client(control_plane.url, time, deadline=20).fetch_config()
    assert sum(time.sleeps) <= 20


def test_redirect_is_not_followed_and_the_key_stays_home(control_plane: FakeControlPlane,
                                                         box_json: dict[str, Any]) -> None:
    elsewhere = FakeControlPlane({BOX: box_json}).start()
    try:
        control_plane.redirect_to = elsewhere.url + "/vllm/config"
        control_plane.script = [302]
        with pytest.raises(FetchError, match=r"redirected .302."):
            client(control_plane.url, FakeTime()).fetch_config()
        assert elsewhere.requests == []
    finally:
        elsewhere.stop()


def test_other_4xx_fails_without_retry(control_plane: FakeControlPlane) -> None:
    control_plane.script = [400]
    with pytest.raises(FetchError, match="answered 400"):
        client(control_plane.url, FakeTime()).fetch_config()


def test_report_is_posted(control_plane: FakeControlPlane) -> None:
    answer = client(control_plane.url, FakeTime()).send_report({"revision": "r", "outcome": "installed"})
    assert answer == {"status": "recorded"}
    assert control_plane.reports == [{"revision": "r", "outcome": "installed"}]


@pytest.mark.parametrize("url", ["http://fleet.example.org", "http://10.0.0.1:8080", "ftp://127.0.0.1", "fleet"])
def test_plain_http_only_to_loopback(url: str) -> None:
    with pytest.raises(FetchError):
        check_url(url)


@pytest.mark.parametrize("url", ["https://fleet.example.org", "http://127.0.0.1:5000", "http://[::1]:80",
                                 "http://localhost:8080"])
def test_accepted_urls(url: str) -> None:
    check_url(url)


@pytest.fixture
def tls_plane(box_json: dict[str, Any], tmp_path: Path) -> Any:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    plane = FakeControlPlane({BOX: box_json}, tls=context).start()
    yield plane, bundle
    plane.stop()


def test_https_with_a_private_ca_bundle(tls_plane: Any, box_json: dict[str, Any]) -> None:
    plane, bundle = tls_plane
    assert plane.url.startswith("https://")
    assert json.loads(client(plane.url, FakeTime(), ca=bundle).fetch_config()) == box_json


def test_untrusted_certificate_fails_at_once(tls_plane: Any) -> None:
    plane, _ = tls_plane
    time = FakeTime()
    with pytest.raises(FetchError, match=r"TLS certificate .* not trusted.*FLEETLLM_CA_BUNDLE"):
        client(plane.url, time).fetch_config()
    assert time.sleeps == []
