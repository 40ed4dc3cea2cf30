"""The box gateway in front of the two real vLLM servers: its config is the one fleetllm renders for a gateway
box (reconciler/fleetllm/core/fleet/boxgateway.py: bearers as ${cred:} references, per-model slots from the recipe's
max-num-seqs), its credentials a $CREDENTIALS_DIRECTORY as the installer writes it; only the upstream
address differs (the servers of this box listen on 127.0.0.2, not behind a gateway on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetllm.adapters.git import read_directory
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.boxgateway import gateway_config
from fleetllm.core.fleet.render import Bearers, render_box
from fleetllm.core.fleet.validate import validate_snapshot
from fleetllm.demo.procs import free_port
from tests.installer.realprocs import http_status, wait_until
from tests.realvllm.conftest import BOX, MAX_NUM_SEQS, SALT, RealBox, post_json
from tests.realvllm.test_reconcile import successes

GATEWAY = Path(sys.executable).parent / "fleetllm-gateway"
CLIENT_TOKEN = "sk-gateway-client-token-0001"


@dataclass
class Gateway:
    url: str
    config: dict[str, object]


@pytest.fixture(scope="module")
def gateway(real_box: RealBox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    fleet = validate_snapshot(read_directory(real_box.root / "fleet")).fleet
    assert fleet is not None
    servers = render_box(fleet, BOX, Bearers(Salt(SALT)))["servers"]  # the box JSON's entries, as served
    port = free_port()
    config = gateway_config(port, servers)
    config["host"] = "127.0.0.1"
    for route in config["models"].values():  # type: ignore[union-attr]
        route["url"] = route["url"].replace("http://127.0.0.1:", f"http://{BOX}:")
    directory = tmp_path_factory.mktemp("gateway")
    credentials = directory / "credentials"
    credentials.mkdir(mode=0o700)
    for name, secret in [("client-token", CLIENT_TOKEN), *((f"bearer-{s['name']}", s["api_key"]) for s in servers)]:
        path = credentials / name
        path.write_text(secret)
        path.chmod(0o600)
    (directory / "gateway.json").write_text(json.dumps(config))
    with (directory / "gateway.log").open("wb") as log:
        process = subprocess.Popen([str(GATEWAY), "--config", str(directory / "gateway.json")],
                                   env={"PATH": os.environ["PATH"], "CREDENTIALS_DIRECTORY": str(credentials)},
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until("the gateway's /health", lambda: http_status(url + "/health") == 200, 60)
        yield Gateway(url, config)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def chat(model: str, **extra: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **extra}


def test_models_api_and_client_bearer(gateway: Gateway, real_box: RealBox) -> None:
    assert http_status(gateway.url + "/v1/models") == 401
    request = urllib.request.Request(gateway.url + "/v1/models", headers={"Authorization": f"Bearer {CLIENT_TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        listing = json.loads(response.read())
    assert sorted(card["id"] for card in listing["data"]) == ["tiny-a", "tiny-b"]
    # The client's token is not vLLM's bearer: vLLM itself refuses it, so a 200 through the gateway
    # means the gateway put each model's own bearer on the request.
    assert post_json(real_box.url("tiny-a") + "/v1/chat/completions", chat("tiny-a"), CLIENT_TOKEN)[0] == 401


def test_body_routing_injects_each_models_bearer(gateway: Gateway, real_box: RealBox) -> None:
    for model in ("tiny-a", "tiny-b"):
        before = successes(real_box, model)
        status, answer = post_json(gateway.url + "/v1/chat/completions", chat(model), CLIENT_TOKEN)
        assert status == 200, answer
        assert answer["model"] == model and answer["usage"]["completion_tokens"] == 4
        assert successes(real_box, model) == before + 1
    assert post_json(gateway.url + "/v1/chat/completions", chat("tiny-a"), "sk-wrong-client-token")[0] == 401
    assert post_json(gateway.url + "/v1/chat/completions", chat("nope"), CLIENT_TOKEN)[0] == 404


def test_path_routing(gateway: Gateway, real_box: RealBox) -> None:
    before = successes(real_box, "tiny-b")
    status, answer = post_json(gateway.url + "/route/tiny-b/v1/completions",
                               {"model": "tiny-b", "prompt": "The quick", "max_tokens": 3}, CLIENT_TOKEN)
    assert status == 200, answer
    assert answer["object"] == "text_completion" and answer["usage"]["completion_tokens"] == 3
    assert successes(real_box, "tiny-b") == before + 1


def test_streaming_through_the_gateway(gateway: Gateway, real_box: RealBox) -> None:
    request = urllib.request.Request(
        gateway.url + "/v1/chat/completions", method="POST",
        data=json.dumps(chat("tiny-a", max_tokens=5, stream=True, stream_options={"include_usage": True})).encode(),
        headers={"Authorization": f"Bearer {CLIENT_TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        events = [line.decode().rstrip("\n") for line in response if line.strip()]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    # role, the tokens, usage: a chunk per token, unless the API server fell behind the engine (a loaded
    # machine): vLLM's RequestOutputCollector then merges the waiting deltas into one chunk
    assert 1 + 1 + 1 <= len(chunks) <= 1 + 5 + 1


def test_a_burst_up_to_what_vllm_accepts_gets_no_503(gateway: Gateway, real_box: RealBox) -> None:
    """The rendered per-model limit is the recipe's max-num-seqs (8) with as many queued: 16 concurrent
    requests to one model all get 200 from the real vLLM, none a 503 from the gateway."""
    route = gateway.config["models"]["tiny-a"]  # type: ignore[index]
    assert (route["maxConcurrentRequests"], route["maxQueuedRequests"]) == (MAX_NUM_SEQS, MAX_NUM_SEQS)
    burst = route["maxConcurrentRequests"] + route["maxQueuedRequests"]
    with ThreadPoolExecutor(burst) as pool:
        results = list(pool.map(lambda _: post_json(gateway.url + "/v1/chat/completions",
                                                    chat("tiny-a", max_tokens=32), CLIENT_TOKEN), range(burst)))
    statuses = [status for status, _ in results]
    assert statuses == [200] * burst, statuses
    assert all(answer["usage"]["completion_tokens"] == 32 for _, answer in results)
