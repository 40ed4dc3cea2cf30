"""The stub vLLM speaks vLLM's wire formats (wire-formats.md §1): checked over real HTTP on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.installer.conftest import STUB_VLLM, free_port
from tests.installer.realprocs import http_status, wait_until

KEY = "sk-vllm-stub-test-key"


class Stub:
    def __init__(self, process: subprocess.Popen[bytes], port: int, events: Path) -> None:
        self.process, self.port, self.events = process, port, events

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def request(self, path: str, body: Any = None, bearer: str | None = KEY) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url(path), data=data)
        if bearer:
            request.add_header("Authorization", f"Bearer {bearer}")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return int(response.status), response.read()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read()

    def read_events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.events.read_text().splitlines()] if self.events.exists() else []


@pytest.fixture
def start_stub(tmp_path: Path) -> Iterator[Any]:
    started: list[subprocess.Popen[bytes]] = []

    def start(*extra: str, env: dict[str, str] | None = None) -> Stub:
        port = free_port()
        events = tmp_path / f"events-{port}.jsonl"
        environment = {"PATH": os.environ["PATH"], "VLLM_API_KEY": KEY, "STUB_VLLM_EVENTS": str(events),
                       **(env or {})}
        process = subprocess.Popen([sys.executable, str(STUB_VLLM), "serve", "org/model", "--host", "127.0.0.1",
                                    "--port", str(port), "--served-model-name", "first", "second", *extra],
                                   env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append(process)
        return Stub(process, port, events)

    yield start
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def test_refuses_connections_while_loading_then_serves(start_stub: Any) -> None:
    stub = start_stub(env={"STUB_VLLM_LOAD_S": "1"})
    wait_until("the start event", stub.read_events)
    assert http_status(stub.url("/health")) is None  # connection refused, not an HTTP status
    wait_until("health", lambda: http_status(stub.url("/health")) == 200)
    status, body = stub.request("/health", bearer=None)
    assert (status, body) == (200, b"")
    assert [e["event"] for e in stub.read_events()] == ["start", "serving"]


def test_models_need_the_bearer_and_have_vllms_shape(start_stub: Any) -> None:
    stub = start_stub("--max-model-len", "4096", "--kv-cache-dtype", "fp8")
    wait_until("health", lambda: http_status(stub.url("/health")) == 200)
    assert stub.request("/v1/models", bearer=None) == (401, b'{"error":"Unauthorized"}')
    assert stub.request("/v1/models", bearer="wrong")[0] == 401
    status, body = stub.request("/v1/models")
    assert status == 200
    listing = json.loads(body)
    assert listing["object"] == "list"
    assert [card["id"] for card in listing["data"]] == ["first", "second"]
    card = listing["data"][0]
    assert (card["object"], card["owned_by"], card["root"], card["parent"], card["max_model_len"]) == (
        "model", "vllm", "org/model", None, 4096)
    assert card["permission"][0]["object"] == "model_permission"
    start = stub.read_events()[0]
    assert start["api_key_set"] is True
    assert KEY not in json.dumps(start)


def test_unguarded_routes_and_metrics(start_stub: Any) -> None:
    stub = start_stub()
    wait_until("health", lambda: http_status(stub.url("/health")) == 200)
    assert json.loads(stub.request("/version", bearer=None)[1]) == {"version": "0.11.0"}
    status, metrics = stub.request("/metrics", bearer=None)
    assert status == 200
    text = metrics.decode()
    assert "# TYPE vllm:num_requests_running gauge" in text
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="first"}' in text
    assert 'kv_cache_size_tokens="100000"' in text


def test_chat_completion_names_the_model_and_port(start_stub: Any) -> None:
    stub = start_stub()
    wait_until("health", lambda: http_status(stub.url("/health")) == 200)
    status, body = stub.request("/v1/chat/completions", {"model": "second",
                                                         "messages": [{"role": "user", "content": "hello"}]})
    assert status == 200
    answer = json.loads(body)
    assert answer["object"] == "chat.completion"
    assert answer["model"] == "first"  # responses use the first served name
    assert answer["choices"][0]["message"]["content"] == f"stub-vllm first port {stub.port}: hello"
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["total_tokens"] == answer["usage"]["prompt_tokens"] + answer["usage"]["completion_tokens"]


def test_streaming_chat_completion(start_stub: Any) -> None:
    stub = start_stub()
    wait_until("health", lambda: http_status(stub.url("/health")) == 200)
    status, body = stub.request("/v1/chat/completions", {
        "model": "first", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200
    events = [line.removeprefix("data: ") for line in body.decode().split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == f"stub-vllm first port {stub.port}: hi"
    assert chunks[-1]["usage"]["completion_tokens"] > 0


def test_unknown_model_and_bad_body(start_stub: Any) -> None:
    stub = start_stub()
    wait_until("health", lambda: http_status(stub.url("/health")) == 200)
    status, body = stub.request("/v1/chat/completions", {"model": "nope", "messages": []})
    assert status == 404
    assert json.loads(body)["error"]["type"] == "NotFoundError"
    assert stub.request("/v1/chat/completions", {"messages": []})[0] == 400


def test_api_key_flag_wins_over_the_environment(start_stub: Any) -> None:
    stub = start_stub("--api-key", "flag-key")
    wait_until("health", lambda: http_status(stub.url("/health")) == 200)
    assert stub.request("/v1/models")[0] == 401
    assert stub.request("/v1/models", bearer="flag-key")[0] == 200


def test_failed_load_exits_non_zero(start_stub: Any) -> None:
    stub = start_stub(env={"STUB_VLLM_FAIL_LOAD": "1"})
    assert stub.process.wait(timeout=30) == 1
    assert [e["event"] for e in stub.read_events()] == ["start", "exit"]


def test_crash_after_serving(start_stub: Any) -> None:
    stub = start_stub(env={"STUB_VLLM_CRASH_AFTER_S": "0.5"})
    assert stub.process.wait(timeout=30) == 1
    assert [e["event"] for e in stub.read_events()] == ["start", "serving", "exit"]
