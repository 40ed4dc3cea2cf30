"""The box side's outgoing HTTP against hostile control planes, issue 27: the installer's and the agent's
fleetllm_installer.fetch.Client, and the provisioning scripts' download of the box program (vast.sh; runpod.sh
runs the same code, tests/installer/test_provision.py). A drip of one byte at a time, an answer cut
mid-body, a redirect, and servers that echo the fleet key back into a reason phrase, a redirect or a
broken status line.

Each server here is a raw socket, so it can break HTTP the way an attacker between the box and the
control plane would. The rest of the policy is tested beside the client: plain http only to loopback
(tests/installer/test_fetch.py::test_plain_http_only_to_loopback), no redirect followed
(::test_redirect_is_not_followed_and_the_key_stays_home), proxies only for https, in a tunnel, and never
for loopback (tests/installer/test_proxy.py); the agent keeping no ETag for a cut body
(tests/installer/test_agent.py::test_a_cut_answer_is_fetched_again_not_a_304_for_ever).
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trustme

from fleetllm_installer import fetch
from fleetllm_installer.fetch import Client, FetchError
from tests.conftest import ROOT
from tests.support.rawserver import serving

FLEET_KEY = "fleet-key-echoed-back-0001"
BOX = "box-a"
DRIP_BYTES = 200  # one every DRIP_GAP_S: 20 s for the whole answer, far past the deadline set below
DRIP_GAP_S = 0.1
DEADLINE_S = 1.0


def client(url: str) -> Client:
    return Client(url, FLEET_KEY, BOX, deadline_s=0.0)


def dripper(prefix: bytes, server_sent: list[int]) -> Callable[[socket.socket, bytes], None]:
    """Sends `prefix` at once, then one byte of a long body every DRIP_GAP_S, counting what got through."""

    def answer(conn: socket.socket, request: bytes) -> None:
        conn.sendall(prefix)
        count = 0
        try:
            for _ in range(DRIP_BYTES):
                conn.sendall(b" ")
                count += 1
                time.sleep(DRIP_GAP_S)
        finally:
            server_sent.append(count)

    return answer


DRIPS = {
    "status line": b"HTTP/1.1 2",
    "headers": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Slow: ",
    "body": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (DRIP_BYTES + 1),
}


@pytest.mark.parametrize("where", sorted(DRIPS))
def test_a_drip_is_cut_at_the_request_deadline(where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A byte every 0.1 s keeps every single read alive; the request as a whole still ends at its deadline
    (before the fix it read the whole 20 s drip: a byte per 5 s held a poll for a minute)."""
    monkeypatch.setattr(fetch, "REQUEST_TIMEOUT_S", DEADLINE_S)
    counted: list[int] = []
    with serving(dripper(DRIPS[where], counted)) as server:
        with pytest.raises(FetchError) as caught:
            client(server.url).poll_config(None)
        assert server.done.wait(30)
    assert "no complete answer within 1 s" in str(caught.value)
    (sent,) = counted
    assert sent < DRIP_BYTES  # the client hung up long before the server was through


def test_a_drip_over_tls_and_a_stalled_handshake_are_cut_at_the_deadline(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "REQUEST_TIMEOUT_S", DEADLINE_S)
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    counted: list[int] = []
    with serving(dripper(DRIPS["headers"], counted), tls=context) as server:
        with pytest.raises(FetchError) as dripped:
            Client(server.url, FLEET_KEY, BOX, bundle, deadline_s=0.0).poll_config(None)
        assert server.done.wait(30)
    # A server that never answers the TLS handshake (it waits for an HTTP head that never comes).
    with serving(lambda conn, request: None) as silent, pytest.raises(FetchError) as stalled:
        Client(silent.url.replace("http://", "https://"), FLEET_KEY, BOX, bundle, deadline_s=0.0).poll_config(None)
    assert "no complete answer within 1 s" in str(dripped.value)
    assert "no complete answer within 1 s" in str(stalled.value)
    (sent,) = counted
    assert sent < DRIP_BYTES


def cut_answer(body: bytes, etag: str) -> Callable[[socket.socket, bytes], None]:
    def answer(conn: socket.socket, request: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nETag: %s\r\nContent-Length: %d\r\n\r\n"
                     % (etag.encode(), len(body)) + body[:len(body) // 2])
        conn.shutdown(socket.SHUT_RDWR)

    return answer


def test_an_answer_cut_short_of_its_content_length_is_an_error_not_a_body() -> None:
    body = b'{"host": "box-a", "servers": []}'
    with serving(cut_answer(body, '"v2"')) as server:
        with pytest.raises(FetchError) as caught:
            client(server.url).poll_config('"v1"')
        with pytest.raises(FetchError):
            client(server.url).fetch_config()  # the installer's fetch: retried to its deadline, then an error
    assert "cut off after 16 bytes, 16 short of its Content-Length" in str(caught.value)


def echoing(status_line: bytes, *headers: bytes) -> Callable[[socket.socket, bytes], None]:
    """Answers with the request's Authorization value pasted into `status_line` and `headers` ({key})."""

    def answer(conn: socket.socket, request: bytes) -> None:
        key = next(line.split(b" ", 2)[2] for line in request.split(b"\r\n")
                   if line.lower().startswith(b"authorization: bearer "))
        head = b"\r\n".join([status_line.replace(b"{key}", key), *(h.replace(b"{key}", key) for h in headers)])
        conn.sendall(head + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    return answer


ECHOES = {
    "reason phrase": (echoing(b"HTTP/1.1 418 refused {key}"), "answered 418 refused [fleet key]"),
    "redirect": (echoing(b"HTTP/1.1 302 Found", b"Location: https://elsewhere.example/?k={key}"),
                 "redirected (302) to https://elsewhere.example/?k=[fleet key]"),
    "broken status line": (echoing(b"HTTP/1.1 2x0 {key}"), "[fleet key]"),
    "key with a control character": (echoing(b"HTTP/1.1 418 \x01{key}\x7f"), "answered 418 ?[fleet key]?"),
}


@pytest.mark.parametrize("case", sorted(ECHOES))
def test_a_server_echoing_the_fleet_key_never_gets_it_into_a_message(case: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    answer, shown = ECHOES[case]
    logged: list[str] = []
    with serving(answer) as server:
        box = Client(server.url, FLEET_KEY, BOX, deadline_s=0.0, log=logged.append)
        with pytest.raises(FetchError) as caught:
            box.fetch_config()
    message = str(caught.value)
    assert shown in message
    assert FLEET_KEY not in message + "".join(logged) + "".join(capsys.readouterr())


# -- the provisioning script's download (vast.sh) ---------------------------------------------------------

VAST = ROOT / "installer" / "fleetllm_installer" / "provision" / "vast.sh"


def provision(url: str, data: Path) -> subprocess.CompletedProcess[str]:
    """vast.sh with one attempt (FLEETLLM_FETCH_DEADLINE_S=0): its download bounds each request at 5 s then."""
    env = {"PATH": os.environ["PATH"], "FLEETLLM_URL": url, "FLEETLLM_FLEET_KEY": FLEET_KEY,
           "FLEETLLM_PYTHON": sys.executable, "PUBLIC_IPADDR": "127.0.0.7", "DATA_DIRECTORY": str(data),
           "FLEETLLM_FETCH_DEADLINE_S": "0"}
    return subprocess.run(["bash", str(VAST)], env=env, capture_output=True, text=True, timeout=120, check=False)


def test_the_provisioning_download_is_cut_at_its_deadline(tmp_path: Path) -> None:
    counted: list[int] = []
    with serving(dripper(DRIPS["body"], counted)) as server:
        done = provision(server.url, tmp_path)
        assert server.done.wait(30)
    assert done.returncode == 1
    assert "no complete answer within the deadline of one request" in done.stderr
    (sent,) = counted
    assert sent < DRIP_BYTES


@pytest.mark.parametrize("case", ["reason phrase", "broken status line", "key with a control character"])
def test_the_provisioning_download_never_logs_an_echoed_fleet_key(case: str, tmp_path: Path) -> None:
    answer, _ = ECHOES[case]
    with serving(answer) as server:
        done = provision(server.url, tmp_path)
    assert done.returncode == 1
    assert "cannot fetch" in done.stderr and "[fleet key]" in done.stderr
    assert FLEET_KEY not in done.stdout + done.stderr


def test_the_provisioning_download_follows_no_redirect(tmp_path: Path) -> None:
    """The key itself never followed a redirect (an unredirected header); the box program is not fetched
    from wherever a Location points either (a plain http address, say)."""
    with serving(echoing(b"HTTP/1.1 200 OK")) as elsewhere:
        target = elsewhere.url.encode() + b"/vllm/installer"
        with serving(echoing(b"HTTP/1.1 302 Found", b"Location: " + target)) as server:
            done = provision(server.url, tmp_path)
        assert not elsewhere.done.is_set()
    assert done.returncode == 1
    assert "HTTP Error 302" in done.stderr
