"""The scenarios' load generator, against the stub vLLM's OpenAI endpoint (the same path LiteLLM
serves): it counts answered requests, names a failure's cause, and keeps sending while a server is gone."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from fleetllm.core.secret import Secret
from fleetllm.demo.load import LoadGenerator, LoadReport, _completed
from fleetllm.demo.procs import free_port
from tests.installer.realprocs import wait_until
from tests.support.idle_server import idle_closing_server


def _stub(port: int, key: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "VLLM_API_KEY": key}
    proc = subprocess.Popen([sys.executable, "-m", "fleetllm.demo.stub_vllm", "serve", "m", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("the stub vLLM did not start")


def snapshot_with(load: LoadGenerator, sent: dict[str, int]) -> LoadReport | None:
    """The running tallies once each model has at least `sent[model]` requests counted, else None."""
    report = load.snapshot()
    return report if all(report.tallies[m].sent >= n for m, n in sent.items()) else None


def test_completed_names_what_is_wrong() -> None:
    assert _completed(200, b'{"choices":[{"message":{"content":"hi"}}]}') is None
    assert _completed(500, b"boom") == "HTTP 500: boom"
    assert "without a completion" in (_completed(200, b'{"choices":[]}') or "")
    assert "without a completion" in (_completed(200, b"not json") or "")


def test_counts_answers_and_failures_per_model_and_keeps_sending_when_the_server_goes() -> None:
    port = free_port()
    key = "sk-load-test-key-0123456789"
    stub = _stub(port, key)
    load = LoadGenerator(f"http://127.0.0.1:{port}", Secret(key, "test key"), ["m", "unknown-model"],
                         rate_per_model=20, timeout_s=5)
    try:
        load.start()
        # Counted once answered: on a loaded machine 20 requests/s can take far longer than 1 s to come back.
        during = wait_until("10 requests to each model counted", lambda: snapshot_with(load, {"m": 10, "unknown-model": 10}))
        stub.send_signal(signal.SIGTERM)
        stub.wait(10)
        wait_until("5 requests failed after the server went", lambda: load.snapshot().tallies["m"].failed >= 5)
    finally:
        report = load.stop()
        if stub.poll() is None:
            stub.kill()
    served = during.tallies["m"]
    assert served.sent >= 10 and served.ok == served.sent - served.failed
    assert served.failed == 0, served.failures
    assert during.tallies["unknown-model"].ok == 0
    assert during.tallies["unknown-model"].failed >= 10
    assert all("HTTP 404" in f.reason for f in during.tallies["unknown-model"].failures)
    after = report.tallies["m"]
    assert after.sent > served.sent  # it kept sending while the server was gone...
    assert after.failed >= 5  # ...and counted those requests as failed
    assert any("Connect" in f.reason for f in after.failures), after.failures[:3]
    assert report.failed == after.failed + report.tallies["unknown-model"].failed
    assert key not in "\n".join(report.lines())


def test_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        LoadGenerator("http://127.0.0.1:9", Secret("k", "k"), ["m"], rate_per_model=0)


IDLE_CLOSE_S = 3.0  # the test server's keep-alive timeout (uvicorn's, LiteLLM's server, is 5 s)


def test_a_connection_the_server_may_have_closed_for_idleness_is_not_reused() -> None:
    """A pooled connection idle for longer than the server keeps it is not sent on: the requests spaced
    wider than the server's keep-alive timeout all succeed (with the pool's default of 15 s each was sent
    on the connection the server was closing, and failed with 'Connection reset by peer')."""
    with idle_closing_server(IDLE_CLOSE_S) as url:
        load = LoadGenerator(url, Secret("k" * 20, "test key"), ["m"], rate_per_model=1 / (IDLE_CLOSE_S + 1),
                             timeout_s=5)
        try:
            load.start()
            wait_until("3 requests counted", lambda: snapshot_with(load, {"m": 3}), 60)
        finally:
            report = load.stop()
    assert report.tallies["m"].failures == []
