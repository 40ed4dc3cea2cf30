"""The box gateway against issue 27's attacks, as a real process:

- incomplete chunked uploads to /route/{model}/: twelve of them took every slot of a model until their
  clients left (LLMhop streams a path-routed body with the slot held), so every other request for that
  model got 503; the slot is now taken only once the body is complete;
- a box JSON whose gateway headers reference `${file:...}` or `${env:...}`: the gateway sent a box file,
  the fleet key and PATH upstream. With `--box-json` (the installer's program always passes it) the
  gateway refuses to start on such a config, naming the field, and reads nothing;
- an upstream that echoes the bearer the gateway injects (into a reason phrase, a broken status line, a
  header name, a cut body) gets it into no log line, and an upstream's redirect is relayed to the client,
  never followed with the bearer. (Its other outgoing rules: a box JSON's config routes only to loopback or
  a unix socket, above and in tests/gateway/test_config.py, and loopback is never proxied,
  tests/gateway/test_proxy.py.)
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.conftest import ROOT, TOKEN, GatewayProcess, running_gateway
from tests.gateway.upstreams import start_tcp_echo
from tests.support.rawserver import RawServer

UPLOADS = 12


@pytest.fixture(scope="module")
def echo_port() -> Iterator[int]:
    running, port = start_tcp_echo()
    yield port
    running.stop()


def incomplete_upload(gw: GatewayProcess) -> socket.socket:
    """A chunked upload that sends its first chunk and then nothing more, and stays connected."""
    sock = socket.create_connection(("127.0.0.1", gw.port), timeout=20)
    sock.sendall(b"POST /route/echo/v1/audio/transcriptions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer "
                 + TOKEN.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
    return sock


def test_incomplete_chunked_uploads_hold_no_slot(echo_port: int) -> None:
    config = {"host": "127.0.0.1", "authTokens": [TOKEN], "maxConcurrentRequests": UPLOADS, "maxQueuedRequests": 0,
              "models": {"echo": {"url": f"http://127.0.0.1:{echo_port}"}}}
    with running_gateway(config) as gw:
        uploads = [incomplete_upload(gw) for _ in range(UPLOADS)]
        try:
            # Were a slot taken before the body is complete, all of echo's would be taken within moments:
            # give the gateway that long (nothing shows an upload whose slot is not taken).
            with contextlib.suppress(AssertionError):
                gw.wait_in_flight("echo", UPLOADS, timeout=2.0)
            statuses = [gw.request("POST", "/route/echo/x", body=b"abc").status for _ in range(10)]
            statuses += [gw.request("POST", "/v1/chat/completions", body=b'{"model": "echo"}').status
                         for _ in range(10)]
            metrics = gw.request("GET", "/metrics").body.decode()
        finally:
            for sock in uploads:
                sock.close()
    assert statuses == [200] * 20
    assert 'fleetllm_gateway_requests_in_flight{model="echo"} 0' in metrics


def test_a_completed_chunked_upload_is_forwarded_whole(echo_port: int) -> None:
    config = {"host": "127.0.0.1", "authTokens": [TOKEN], "models": {"echo": {"url": f"http://127.0.0.1:{echo_port}"}}}
    with running_gateway(config) as gw:
        raw = gw.raw(b"POST /route/echo/up HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " + TOKEN.encode()
                     + b"\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    echoed = json.loads(body)
    assert [value for name, value in echoed["headers"] if name.lower() == "content-length"] == ["5"]


SECRET_FILE_TEXT = "root:box-secret-file-line"
FLEET_KEY = "fleet-key-in-the-gateway-environment"


@pytest.mark.parametrize("reference", ["${file:%s}", "${env:FLEETLLM_FLEET_KEY}", "${env:PATH}"])
def test_a_box_json_gateway_cannot_read_box_files_or_environment(reference: str, tmp_path: Path,
                                                                 echo_port: int) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET_FILE_TEXT)
    value = reference.replace("%s", str(secret))
    config = tmp_path / "gateway.json"
    config.write_text(json.dumps({"host": "127.0.0.1", "port": 0, "models": {
        "echo": {"url": f"http://127.0.0.1:{echo_port}", "headers": {"X-Leak": value}}}}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLEETLLM_FLEET_KEY": FLEET_KEY}
    for check in ([], ["--check"]):
        done = subprocess.run([sys.executable, "-m", "fleetllm_gateway", "--box-json", *check, "--config", str(config)],
                              capture_output=True, text=True, env=env, timeout=60, check=False)
        output = done.stdout + done.stderr
        assert done.returncode == 1
        assert f"models.echo.headers.X-Leak: {value} is refused in a config from a box JSON" in output
        assert SECRET_FILE_TEXT not in output and FLEET_KEY not in output


UPSTREAM_BEARER = "bearer-of-the-upstream-Hq2Zk9"


def hostile_upstream(answer: bytes) -> tuple[RawServer, list[bytes]]:
    """A loopback upstream answering every request with `answer`, {bearer} replaced by the Authorization
    value it received; `seen` collects the requests."""
    seen: list[bytes] = []

    def respond(conn: socket.socket, request: bytes) -> None:
        seen.append(request)
        bearer = next((line.split(b": ", 1)[1] for line in request.split(b"\r\n")
                       if line.lower().startswith(b"authorization: ")), b"")
        conn.sendall(answer.replace(b"{bearer}", bearer))

    return RawServer(respond).start(), seen


@contextlib.contextmanager
def behind_the_gateway(upstream: RawServer, credentials: Path) -> Iterator[GatewayProcess]:
    """A gateway routing `echo` to `upstream`, injecting its bearer read from a credential, as on a box."""
    (credentials / "bearer-echo").write_text(UPSTREAM_BEARER + "\n")
    config = {"host": "127.0.0.1", "authTokens": [TOKEN], "models": {"echo": {
        "url": upstream.url,
        "headers": {"Authorization": "Bearer ${cred:bearer-echo}"}}}}
    with running_gateway(config, {"CREDENTIALS_DIRECTORY": str(credentials)}) as gw:
        yield gw


ECHOES = {
    "reason phrase": (b"HTTP/1.1 200 {bearer}\r\nContent-Length: 0\r\n\r\n", 200),  # relayed, never logged
    "broken status line": (b"HTTP/1.1 2x0 {bearer}\r\n\r\n", 502),
    # a header name with a space: relayed as it was, it left the client waiting for ever; now a 502
    "header name": (b"HTTP/1.1 200 OK\r\nX-{bearer}: y\r\nContent-Length: 0\r\n\r\n", 502),
    "cut body": (b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n{bearer}", 502),
}


@pytest.mark.parametrize("case", sorted(ECHOES))
def test_an_upstream_echoing_its_bearer_gets_it_into_no_log_line(case: str, tmp_path: Path) -> None:
    answer, status = ECHOES[case]
    upstream, seen = hostile_upstream(answer)
    try:
        with behind_the_gateway(upstream, tmp_path) as gw:
            reply = gw.request("POST", "/route/echo/x", body=b"{}")
            log = gw.stderr()
    finally:
        upstream.stop()
    assert seen and UPSTREAM_BEARER.encode() in seen[0]  # the bearer went upstream, and only there
    assert reply.status == status
    assert UPSTREAM_BEARER not in log


def test_an_upstream_redirect_is_relayed_never_followed(tmp_path: Path) -> None:
    """The gateway hands a 3xx to its client: the bearer it injects never follows a Location elsewhere."""
    elsewhere = socket.create_server(("127.0.0.1", 0))
    elsewhere.settimeout(0.5)
    location = f"http://127.0.0.1:{elsewhere.getsockname()[1]}/steal".encode()
    upstream, seen = hostile_upstream(b"HTTP/1.1 302 Found\r\nLocation: " + location + b"\r\nContent-Length: 0\r\n\r\n")
    try:
        with behind_the_gateway(upstream, tmp_path) as gw:
            reply = gw.request("POST", "/route/echo/x", body=b"{}")
        with pytest.raises(TimeoutError):
            elsewhere.accept()
    finally:
        upstream.stop()
        elsewhere.close()
    assert reply.status == 302 and reply.header("Location") == location.decode()
    assert len(seen) == 1
