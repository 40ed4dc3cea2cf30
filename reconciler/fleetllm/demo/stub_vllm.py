#!/usr/bin/env python3
"""Stub vLLM: stands in for the GPU process in tests, speaking vLLM's wire formats. Standard library only.

Command line (what the installer writes; `vllm` on PATH can be a link to this file):

    stub_vllm.py serve MODEL [--host H] [--port P] [--served-model-name N [N ...]] [--max-model-len L]
                 [--gpu-memory-utilization F] [--api-key K] [--dtype D] [any other vLLM argument, accepted and ignored]
    stub_vllm.py --version

Defaults: --host 127.0.0.1 (real vLLM: all interfaces), --port 8000, served name = MODEL.

Behaviour (shapes from docs/wire-formats.md, "vLLM's OpenAI server"):
- While "loading" the port is bound but not listening, so a connect is refused (ECONNREFUSED), as
  with a real vLLM building its engine. Then it logs `Application startup complete.` and serves.
- GET /health, /ping: 200, empty body. GET /version: {"version": ...}. GET /load: {"server_load": n}.
- Auth (VLLM_API_KEY from the environment, or --api-key which wins; no key = no auth at all):
  paths under /v1, /v2, /inference, /cohere need `Authorization: Bearer <key>` (scheme
  case-insensitive, constant-time compare), else 401 {"error":"Unauthorized"}. OPTIONS is not checked.
- GET /v1/models: one card per served name ({"object":"list","data":[...]}, vLLM's card shape).
- POST /v1/chat/completions and /v1/completions: an OpenAI-style answer whose `model` is the first
  served name and whose text is "stub-vllm <served name> port <P>: <last user message>", so a test
  can tell which stub answered. "stream": true answers server-sent events ending in `data: [DONE]`.
  Unknown model: 404 {"error":{"message":...,"type":"NotFoundError","param":null,"code":404}}.
- GET /metrics: Prometheus text with vllm:num_requests_running, vllm:num_requests_waiting,
  vllm:kv_cache_usage_perc (gauges), vllm:cache_config_info{kv_cache_size_tokens=...}, and the
  counters vllm:prompt_tokens_total, vllm:generation_tokens_total, vllm:request_success_total.
- SIGTERM/SIGINT: exits 0. The key is never printed or written anywhere.

Knobs (environment variables):
    STUB_VLLM_LOAD_S          seconds to refuse connections before serving (default 0)
    STUB_VLLM_FAIL_LOAD       if set, exit 1 at the end of loading instead of serving (a load crash)
    STUB_VLLM_CRASH_AFTER_S   exit 1 this many seconds after it started serving (a crash at run time)
    STUB_VLLM_EVENTS          append JSON lines here: {"event": "start"|"serving"|"exit", "time", "pid",
                              "port", "served_model_name", "argv" (start only), "api_key_set"}
    STUB_VLLM_KV_TOKENS       kv_cache_size_tokens in /metrics (default 100000)
    STUB_VLLM_MAX_MODEL_LEN   max_model_len on /v1/models when --max-model-len is absent (default 32768)
    STUB_VLLM_VERSION         version reported by /version and --version (default 0.11.0)
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DTYPES = ("auto", "bfloat16", "float", "float16", "float32", "half")
GUARDED = ("/v1", "/v2", "/inference", "/cohere")
VERSION = os.environ.get("STUB_VLLM_VERSION", "0.11.0")


_LOG_LOCK = threading.RLock()  # re-entrant: the signal handler logs too, on the main thread


def log(message: str) -> None:
    """One line on stdout, whole: request threads log at once, and print() writes the text and its newline
    apart (two threads could leave `line line` and an empty line)."""
    line = f"INFO {time.strftime('%m-%d %H:%M:%S')} [stub_vllm] {message}\n"
    with _LOG_LOCK:
        sys.stdout.write(line)
        sys.stdout.flush()


def event(kind: str, config: argparse.Namespace, **extra: Any) -> None:
    path = os.environ.get("STUB_VLLM_EVENTS")
    if not path:
        return
    record = {"event": kind, "time": time.time(), "pid": os.getpid(), "port": config.port,
              "served_model_name": config.served_names[0], **extra}
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.successes = 0


class Handler(BaseHTTPRequestHandler):
    server: StubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # one access line, no headers
        log(f'{self.client_address[0]} "{self.command} {self.path}" {args[1] if len(args) > 1 else ""}')

    # -- responses -------------------------------------------------------------------------------
    def send_body(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        if body or status != 200:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_json(self, status: int, document: Any) -> None:
        self.send_body(status, json.dumps(document, separators=(",", ":")).encode())

    def error(self, status: int, kind: str, message: str, param: str | None = None) -> None:
        self.send_json(status, {"error": {"message": message, "type": kind, "param": param, "code": status}})

    def authorised(self) -> bool:
        keys = self.server.api_keys
        if not keys or not self.path.startswith(GUARDED):
            return True
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        presented = hashlib.sha256(token.strip().encode()).digest()
        return any(hmac.compare_digest(presented, hashlib.sha256(k.encode()).digest()) for k in keys)

    def read_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"null")
        except ValueError:
            return None

    # -- routes ----------------------------------------------------------------------------------
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if not self.authorised():
            self.send_json(401, {"error": "Unauthorized"})
        elif path in ("/health", "/ping"):
            self.send_body(200, b"")
        elif path == "/version":
            self.send_json(200, {"version": VERSION})
        elif path == "/load":
            self.send_json(200, {"server_load": self.server.stats.running})
        elif path == "/metrics":
            self.send_body(200, self.server.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/v1/models":
            self.send_json(200, self.server.models())
        else:
            self.send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if not self.authorised():
            self.send_json(401, {"error": "Unauthorized"})
            return
        if path not in ("/v1/chat/completions", "/v1/completions"):
            self.send_json(404, {"detail": "Not Found"})
            return
        request = self.read_json()
        if not isinstance(request, dict) or not isinstance(request.get("model"), str):
            self.error(400, "BadRequestError", "the request body must be a JSON object with a \"model\"")
            return
        if request["model"] not in self.server.config.served_names:
            aliases = ", ".join(self.server.config.served_names)
            self.error(404, "NotFoundError", f"The model `{request['model']}` does not exist. "
                                             f"Valid aliases: {aliases}.", param="model")
            return
        max_tokens = request.get("max_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                       or not 0 < max_tokens <= self.server.max_model_len()):
            self.error(400, "BadRequestError", f"max_tokens={max_tokens} cannot be greater than max_model_len="
                                               f"{self.server.max_model_len()}. Please request fewer output tokens. "
                                               f"(parameter=max_tokens, value={max_tokens})", param="max_tokens")
            return
        chat = path.endswith("chat/completions")
        prompt = self.server.last_user_text(request, chat)
        if prompt is None:
            self.error(400, "BadRequestError", "messages must be a list of {role, content}" if chat
                       else "prompt must be a string")
            return
        self.server.complete(self, request, prompt, chat)


class StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, config: argparse.Namespace, api_keys: list[str]) -> None:
        super().__init__((config.host, config.port), Handler, bind_and_activate=False)
        self.config = config
        self.api_keys = api_keys
        self.stats = Stats()
        self.created = int(time.time())

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        super().server_bind()

    def max_model_len(self) -> int:
        return int(self.config.max_model_len or os.environ.get("STUB_VLLM_MAX_MODEL_LEN", "32768"))

    def models(self) -> dict[str, Any]:
        config = self.config
        max_len = self.max_model_len()
        now = int(time.time())
        cards = [{"id": name, "object": "model", "created": now, "owned_by": "vllm", "root": config.model,
                  "parent": None, "max_model_len": max_len,
                  "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                                  "created": now, "allow_create_engine": False, "allow_sampling": True,
                                  "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                  "allow_fine_tuning": False, "organization": "*", "group": None,
                                  "is_blocking": False}]}
                 for name in config.served_names]
        return {"object": "list", "data": cards}

    def metrics(self) -> str:
        name = self.config.served_names[0]
        labels = f'engine="0",model_name="{name}"'
        kv_tokens = int(os.environ.get("STUB_VLLM_KV_TOKENS", "100000"))
        stats = self.stats
        return "".join([
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n",
            "# TYPE vllm:num_requests_running gauge\n",
            f"vllm:num_requests_running{{{labels}}} {float(stats.running)}\n",
            "# TYPE vllm:num_requests_waiting gauge\n",
            f"vllm:num_requests_waiting{{{labels}}} 0.0\n",
            "# TYPE vllm:kv_cache_usage_perc gauge\n",
            f"vllm:kv_cache_usage_perc{{{labels}}} {min(stats.running * 0.1, 1.0)}\n",
            "# TYPE vllm:cache_config_info gauge\n",
            f'vllm:cache_config_info{{block_size="16",engine="0",kv_cache_size_tokens="{kv_tokens}",'
            f'num_gpu_blocks="{kv_tokens // 16}"}} 1.0\n',
            "# TYPE vllm:prompt_tokens_total counter\n",
            f"vllm:prompt_tokens_total{{{labels}}} {float(stats.prompt_tokens)}\n",
            "# TYPE vllm:generation_tokens_total counter\n",
            f"vllm:generation_tokens_total{{{labels}}} {float(stats.generation_tokens)}\n",
            "# TYPE vllm:request_success_total counter\n",
            f'vllm:request_success_total{{{labels},finished_reason="stop"}} {float(stats.successes)}\n',
        ])

    @staticmethod
    def last_user_text(request: dict[str, Any], chat: bool) -> str | None:
        if not chat:
            prompt = request.get("prompt")
            return prompt if isinstance(prompt, str) else None
        messages = request.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return None
        for message in reversed(messages):
            if message.get("role") == "user":
                content = message.get("content")
                if isinstance(content, list):  # content parts
                    return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
                return str(content or "")
        return ""

    def complete(self, handler: Handler, request: dict[str, Any], prompt: str, chat: bool) -> None:
        """The answer's text, one "token" per word, cut at max_tokens (finish_reason "length") as vLLM does."""
        name = self.config.served_names[0]
        words = f"stub-vllm {name} port {self.config.port}: {prompt}".split(" ")
        max_tokens = request.get("max_tokens")
        finish = "stop"
        if isinstance(max_tokens, int) and len(words) >= max_tokens:
            words, finish = words[:max_tokens], "length"
        pieces = [word if i == 0 else " " + word for i, word in enumerate(words)]
        text = "".join(pieces)
        prompt_tokens, completion_tokens = max(len(prompt.split()), 1), len(pieces)
        counts = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
                  "completion_tokens": completion_tokens}
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:16]
        created = int(time.time())
        with self.stats.lock:
            self.stats.running += 1
        try:
            if request.get("stream") is True:
                self._stream(handler, ident, created, name, pieces, finish, chat, counts,
                             bool((request.get("stream_options") or {}).get("include_usage")))
            else:
                usage = {**counts, "prompt_tokens_details": None, "completion_tokens_details": None}
                end = {"service_tier": None, "system_fingerprint": self.fingerprint, "usage": usage}
                if chat:
                    message = {"role": "assistant", "content": text, "refusal": None, "annotations": None,
                               "audio": None, "function_call": None, "reasoning": None}
                    choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None,
                                              "finish_reason": finish, "stop_reason": None, "token_ids": None,
                                              "routed_experts": None}
                    tail: dict[str, Any] = {"prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None}
                else:
                    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                              "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
                              "prompt_token_ids": None, "routed_experts": None}
                    tail = {}
                handler.send_json(200, {"id": ident, "object": "chat.completion" if chat else "text_completion",
                                        "created": created, "model": name, "choices": [choice], **end, **tail,
                                        "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None})
        finally:
            with self.stats.lock:
                self.stats.running -= 1
                self.stats.successes += 1
                self.stats.prompt_tokens += prompt_tokens
                self.stats.generation_tokens += completion_tokens

    @property
    def fingerprint(self) -> str:
        return f"vllm-{VERSION}-{self.created & 0xFFFFFFFF:08x}"

    def _stream(self, handler: Handler, ident: str, created: int, name: str, pieces: list[str], finish: str,
                chat: bool, counts: dict[str, int], include_usage: bool) -> None:
        """Server-sent events in HTTP/1.1 chunked encoding, as vLLM's uvicorn sends them: for chat a first
        chunk with the role, then one chunk per token, the last token's carrying finish_reason; the usage
        chunk (choices: []) only when asked for; then `data: [DONE]`."""
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        kind = "chat.completion.chunk" if chat else "text_completion"

        def send(data: str) -> None:
            event = f"data: {data}\n\n".encode()
            handler.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            handler.wfile.flush()

        def chunk(choice: dict[str, Any], **extra: Any) -> None:
            body = {"id": ident, "object": kind, "created": created, "model": name, "choices": [choice], **extra}
            send(json.dumps(body, separators=(",", ":")))

        if chat:
            chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None},
                  prompt_token_ids=None, prompt_text=None)
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            ending: dict[str, Any] = {"finish_reason": finish if last else None}
            if last or not chat:
                ending["stop_reason"] = None
            if chat:
                choice: dict[str, Any] = {"index": 0, "delta": {"content": piece}, "logprobs": None, **ending,
                                          "token_ids": None}
                chunk(choice)
            else:
                choice = {"index": 0, "text": piece, "logprobs": None, **ending, "prompt_token_ids": None,
                          "token_ids": None}
                chunk(choice, **({"system_fingerprint": self.fingerprint} if last else {}))
        if include_usage:
            send(json.dumps({"id": ident, "object": kind, "created": created, "model": name, "choices": [],
                             "usage": counts, "system_fingerprint": self.fingerprint}, separators=(",", ":")))
        send("[DONE]")
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vllm", description="stub vLLM for tests")
    parser.add_argument("--version", action="store_true")
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve")
    serve.add_argument("model")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", nargs="+", dest="served_names")
    serve.add_argument("--max-model-len", type=int)
    serve.add_argument("--gpu-memory-utilization", type=float)
    serve.add_argument("--api-key", action="append")
    # vLLM 0.32's choices: an unknown dtype is an argparse error, exit 2 before anything loads (the
    # rollout scenarios' "bad boot change"; tests/realvllm/test_bad_argument.py compares both).
    serve.add_argument("--dtype", choices=DTYPES)
    config, extra = parser.parse_known_args(argv)
    if config.version:
        print(VERSION)
        raise SystemExit(0)
    if config.command != "serve":
        parser.error("only `serve` is implemented")
    if config.gpu_memory_utilization is not None and not 0 < config.gpu_memory_utilization <= 1:
        parser.error("--gpu-memory-utilization must be in (0, 1]")
    config.served_names = config.served_names or [config.model]
    config.extra = extra
    return config


def main(argv: list[str] | None = None) -> int:
    config = parse_args(sys.argv[1:] if argv is None else argv)
    env_key = os.environ.get("VLLM_API_KEY", "")
    api_keys = config.api_key or ([env_key] if env_key else [])
    event("start", config, argv=sys.argv[1:] if argv is None else argv, api_key_set=bool(api_keys))

    def stop(signum: int, _frame: Any) -> None:
        event("exit", config, signal=signum)
        log(f"received signal {signum}, shutting down")
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server = StubServer(config, api_keys)
    server.server_bind()  # bound, not listening: connects are refused while "loading"
    log("SIMULATED vLLM: fleetllm's stub (no GPU, no model loaded), speaking vLLM's HTTP API")
    log(f"non-default args: model={config.model!r} served={config.served_names} port={config.port} "
        f"max_model_len={config.max_model_len} gpu_memory_utilization={config.gpu_memory_utilization} "
        f"extra={len(config.extra)} args")
    time.sleep(float(os.environ.get("STUB_VLLM_LOAD_S", "0") or 0))
    if os.environ.get("STUB_VLLM_FAIL_LOAD"):
        log("ERROR engine core initialisation failed (STUB_VLLM_FAIL_LOAD)")
        event("exit", config, code=1)
        return 1
    server.server_activate()
    event("serving", config)
    log(f"Starting vLLM API server on http://{config.host}:{config.port}")
    log("Application startup complete.")
    crash_after = os.environ.get("STUB_VLLM_CRASH_AFTER_S")
    if crash_after:
        def crash() -> None:
            log("ERROR engine core died (STUB_VLLM_CRASH_AFTER_S)")
            event("exit", config, code=1)
            os._exit(1)
        timer = threading.Timer(float(crash_after), crash)
        timer.daemon = True
        timer.start()
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
