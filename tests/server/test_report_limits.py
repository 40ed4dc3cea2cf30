"""POST /vllm/report against the real server process: every refused report gets a clear 4xx with a
JSON reason and is recorded like any other request (fetch log, request metrics). issue 16, finding 8:
a report nested 25,000 levels deep or holding a 5,000-digit integer was a 500 missing from both, and a
chunked report over 64 KiB was cut to 64 KiB instead of getting its 413."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetllm.adapters.state import open_store
from fleetllm.demo.procs import free_port, stop
from fleetllm.server.reports import MAX_REPORT_BYTES, MAX_REPORT_DEPTH
from tests.server.conftest import ENV, KNOWN_BOX, SECRETS, base_config, box_headers, write_config

VALID = {"revision": "abc123", "installer_version": "0.1.0", "outcome": "installed", "message": "ok"}
HEADERS = {**box_headers(KNOWN_BOX), "Content-Type": "application/json"}


def _deep(levels: int) -> bytes:
    return b'{"revision": "a", "installer_version": "1", "outcome": "installed", "fit": ' + \
        b"[" * levels + b"]" * levels + b"}"


# name -> (body, chunked, status, words the reason must hold)
CASES: dict[str, tuple[bytes, bool, int, str]] = {
    "nested-25000": (_deep(25_000), False, 400, f"levels deep (at most {MAX_REPORT_DEPTH})"),
    "nested-25000-chunked": (_deep(25_000), True, 400, "levels deep"),
    "nested-1000": (_deep(1_000), False, 400, "levels deep"),
    "nested-objects": (b'{"a":' * 5_000 + b"1" + b"}" * 5_000, False, 400, "levels deep"),
    "int-5000-digits": (json.dumps({**VALID, "fit": {"ok": True, "vram_needed_gb": 0}}).encode().replace(
        b'"vram_needed_gb": 0', b'"vram_needed_gb": ' + b"7" * 5000), False, 400, "a number has 5000 characters"),
    "float-overflow": (json.dumps(VALID).encode()[:-1] + b', "fit": {"ok": true, "vram_needed_gb": 1e999}}',
                       False, 400, "out of range"),
    "chunked-over-64k": (json.dumps({**VALID, "message": "x" * MAX_REPORT_BYTES}).encode(), True, 413, "64 KiB"),
    "declared-over-64k": (json.dumps({**VALID, "message": "x" * MAX_REPORT_BYTES}).encode(), False, 413, "64 KiB"),
    "chunked-valid": (json.dumps(VALID).encode(), True, 200, ""),
}


@pytest.fixture
def server(tmp_path: Path, fleet_git: Path) -> Iterator[tuple[int, Path, subprocess.Popen[bytes]]]:
    config = write_config(tmp_path / "cp.yaml", base_config(fleet_git, tmp_path / "state.db"))
    port = free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        process = subprocess.Popen([sys.executable, "-m", "fleetllm", "serve", "--config", str(config),
                                    "--listen", f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, **ENV}, start_new_session=True)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if _request(port, "GET", "/health")[0] == 200:
                        break
                except OSError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(log_path.read_text())
                time.sleep(0.2)
            yield port, log_path, process
        finally:
            stop(process, timeout_s=15)


def _request(port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
             chunked: bool = False) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        if chunked:
            conn.putrequest(method, path)
            for name, value in (headers or {}).items():
                conn.putheader(name, value)
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            data = body or b""
            try:
                for start in range(0, len(data), 8192):
                    piece = data[start:start + 8192]
                    conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
                conn.send(b"0\r\n\r\n")
            except OSError:  # the server may answer and close before the end of a refused body
                pass
        else:
            conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_refused_reports_get_a_clear_4xx_and_are_recorded(server: tuple[int, Path, subprocess.Popen[bytes]],
                                                          tmp_path: Path) -> None:
    port, log_path, process = server
    expected: list[int] = []
    for name, (body, chunked, status, reason) in CASES.items():
        got, answer = _request(port, "POST", "/vllm/report", body, HEADERS, chunked=chunked)
        assert got == status, (name, answer[:300])
        if status != 200:
            assert reason in json.loads(answer)["error"], (name, answer[:300])
        expected.append(status)
    metrics = _request(port, "GET", "/metrics")[1].decode()
    for status in sorted(set(expected)):
        line = f'fleetllm_box_requests_total{{endpoint="report",status="{status}"}} {float(expected.count(status))}'
        assert line in metrics, (line, [m for m in metrics.splitlines() if "box_requests" in m])
    assert 'status="500"' not in metrics
    os.killpg(process.pid, signal.SIGTERM)  # a graceful stop writes out what is buffered
    assert process.wait(timeout=15) == 0
    text = log_path.read_text()
    assert "Traceback" not in text
    for secret in SECRETS:
        assert secret not in text
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        fetches = [(f.endpoint.value, f.status, f.box) for f in reversed(store.recent_fetches())]
    finally:
        store.close()
    assert fetches == [("report", status, KNOWN_BOX) for status in expected]


def test_brackets_inside_strings_do_not_count() -> None:
    """(Valid installer reports pass these limits: test_box_api.py sends the installer's own.)"""
    from fleetllm.server.reports import nesting_depth

    assert nesting_depth(b'{"a": "[[[[[[", "b": "\\"[[[", "c": [[1]]}') == 3
    assert nesting_depth(b'"unterminated [[[[') == 0
