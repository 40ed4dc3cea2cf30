"""The fleet key never reaches a proxy in clear (issue 16, finding 12).

With http_proxy set and a loopback http:// control plane, urllib handed the proxy the whole request,
`Authorization: Bearer <fleet key>` included. Here a real listener on loopback plays the proxy and
records every byte it receives: plain http never goes to it (the installer's client and the
provisioning script); https goes to it only as a CONNECT tunnel (host and port, the request inside TLS),
and not at all for a host in no_proxy.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from fleetllm_installer.fetch import Client
from fleetllm_installer.zipapp import build_zipapp_bytes
from tests.conftest import ROOT
from tests.installer.conftest import BOX, FLEET_KEY, FakeControlPlane

PROXY_VARS = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "no_proxy",
              "NO_PROXY")


class RecordingProxy:
    """A forward proxy on loopback that records what it receives: a plain request is answered 502 (so a
    client that used it fails visibly), CONNECT is tunnelled to the target and recorded up to the tunnel."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.received: list[bytes] = []
        self.connects: list[str] = []
        self.stopped = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def serve(self) -> None:
        self.listener.settimeout(0.1)
        while not self.stopped:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                head += chunk
            self.received.append(head)
            line = head.split(b"\r\n", 1)[0].decode("latin-1")
            if not line.startswith("CONNECT "):
                conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            target = line.split()[1]
            self.connects.append(target)
            host, port = target.rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=10) as upstream:
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                self.relay(conn, upstream)

    @staticmethod
    def relay(a: socket.socket, b: socket.socket) -> None:
        while True:
            ready, _, _ = select.select([a, b], [], [], 10)
            if not ready:
                return
            for source in ready:
                data = source.recv(65536)
                if not data:
                    return
                (b if source is a else a).sendall(data)

    def stop(self) -> None:
        self.stopped = True
        self.listener.close()
        self.thread.join(timeout=5)


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingProxy]:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
    recording = RecordingProxy()
    yield recording
    recording.stop()


def every_proxy_variable(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    for name in PROXY_VARS[:6]:
        monkeypatch.setenv(name, url)


def test_plain_http_to_the_loopback_control_plane_never_uses_the_proxy(
        proxy: RecordingProxy, control_plane: FakeControlPlane, box_json: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    every_proxy_variable(monkeypatch, proxy.url)
    client = Client(control_plane.url, FLEET_KEY, BOX, deadline_s=0)
    assert json.loads(client.fetch_config()) == box_json
    client.send_report({"outcome": "dry_run"}, deadline_s=0)
    assert proxy.received == []  # before the fix: "GET http://127.0.0.1:.../vllm/config" with the fleet key


@pytest.fixture
def tls_plane(box_json: dict[str, Any], tmp_path: Path) -> Iterator[tuple[FakeControlPlane, Path]]:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    plane = FakeControlPlane({BOX: box_json}, tls=context).start()
    yield plane, bundle
    plane.stop()


def test_https_goes_through_the_proxy_only_as_a_tunnel(proxy: RecordingProxy, box_json: dict[str, Any],
                                                       tls_plane: tuple[FakeControlPlane, Path],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    plane, bundle = tls_plane
    every_proxy_variable(monkeypatch, proxy.url)
    client = Client(plane.url, FLEET_KEY, BOX, bundle, deadline_s=0)
    assert json.loads(client.fetch_config()) == box_json
    port = plane.url.rsplit(":", 1)[1]
    assert proxy.connects == [f"127.0.0.1:{port}"]
    assert all(FLEET_KEY.encode() not in head and b"Authorization" not in head for head in proxy.received)


def test_no_proxy_is_respected_for_https(proxy: RecordingProxy, box_json: dict[str, Any],
                                         tls_plane: tuple[FakeControlPlane, Path],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    plane, bundle = tls_plane
    every_proxy_variable(monkeypatch, proxy.url)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    assert json.loads(Client(plane.url, FLEET_KEY, BOX, bundle, deadline_s=0).fetch_config()) == box_json
    assert proxy.received == []


def test_the_provisioning_script_never_sends_the_key_to_a_proxy(proxy: RecordingProxy, box_env: Path,
                                                                control_plane: FakeControlPlane) -> None:
    control_plane.installer = build_zipapp_bytes()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETLLM_", "LLMAO_"))}
    env.update({"ASFQUART_URL": control_plane.url, "FLEET_KEY": FLEET_KEY, "FLEETLLM_PYTHON": sys.executable,
                "FLEETLLM_SUPERVISOR_CONF_DIR": str(box_env.parent / "conf.d"), "FLEETLLM_LISTEN_HOST": "127.0.0.1",
                "FLEETLLM_FETCH_DEADLINE_S": "0", "PUBLIC_IPADDR": BOX, "DATA_DIRECTORY": str(box_env),
                **dict.fromkeys(PROXY_VARS[:6], proxy.url)})
    done = subprocess.run(["bash", str(ROOT / "installer" / "fleetllm_installer" / "provision" / "vast.sh"), "--dry-run",
                           "--assume-gpus", "1x80", "--handover", "none"], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert f"installer sha256 {hashlib.sha256(control_plane.installer).hexdigest()}" in done.stderr
    assert proxy.received == []
    assert control_plane.reports[-1]["outcome"] == "dry_run"


def test_the_provisioning_script_refuses_plain_http_to_another_host(proxy: RecordingProxy, box_env: Path) -> None:
    env = {"PATH": os.environ["PATH"], "ASFQUART_URL": "http://192.0.2.1:8080", "FLEET_KEY": FLEET_KEY,
           "FLEETLLM_PYTHON": sys.executable, "PUBLIC_IPADDR": BOX, "DATA_DIRECTORY": str(box_env),
           "http_proxy": proxy.url}
    done = subprocess.run(["bash", str(ROOT / "installer" / "fleetllm_installer" / "provision" / "vast.sh")], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode != 0 and "must be https://" in done.stderr
    assert proxy.received == []
