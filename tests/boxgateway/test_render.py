"""The box JSON of a gateway box: servers on loopback, the gateway's port, bearer and config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetllm.cli.main import main as fleetllm
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.boxgateway import VLLM_DEFAULT_MAX_NUM_SEQS
from fleetllm.core.fleet.render import Bearers, render_all, render_box
from fleetllm_gateway.config import DEFAULT_MAX_CONCURRENT, load_config, parse_config
from tests.boxgateway.fleets import (
    BEARERS,
    BOX,
    EXAMPLE_GATEWAY_BOX,
    GATEWAY_PLACEMENT,
    example_with_gateway,
    load,
)
from tests.conftest import TEST_SALT
from tests.fleet.helpers import MODELS, validate


def rendered(placement: str = GATEWAY_PLACEMENT, bearers: Bearers = BEARERS, models: str = MODELS) -> Any:
    result = validate(placement=placement, models=models)
    assert result.fleet is not None, [d.text() for d in result.diagnostics]
    return render_box(result.fleet, BOX, bearers)


def test_servers_listen_on_loopback_and_keep_their_own_bearers() -> None:
    doc = rendered()
    assert list(doc) == ["host", "revision", "servers", "gateway", "agent", "report_key"]
    first = doc["servers"][0]
    assert list(first)[:7] == ["name", "model", "served_model_name", "host", "port", "listen_host", "api_key"]
    assert (first["port"], first["listen_host"]) == (9001, "127.0.0.1")
    assert first["api_key"] == Salt(TEST_SALT).derive(BOX, 9001)


def test_the_gateway_section() -> None:
    doc = rendered()
    gateway = doc["gateway"]
    assert list(gateway) == ["port", "api_key", "models", "config", "digest"]
    assert gateway["port"] == 8001
    assert gateway["api_key"] == Salt(TEST_SALT).derive(BOX, 8001)
    assert gateway["models"] == {"m1": "m1", "m2": "m2"}
    assert gateway["config"] == {
        "host": "0.0.0.0", "port": 8001, "authTokens": ["${cred:client-token}"],  # noqa: S104
        "maxBodyBytes": 104857600, "queueTimeoutSeconds": 30, "connectTimeoutSeconds": 5,
        "models": {
            "m1": {"url": "http://127.0.0.1:9001", "headers": {"Authorization": "Bearer ${cred:bearer-m1}"},
                   "maxConcurrentRequests": 1024, "maxQueuedRequests": 1024},
            "m2": {"url": "http://127.0.0.1:9002", "headers": {"Authorization": "Bearer ${cred:bearer-m2}"},
                   "maxConcurrentRequests": 1024, "maxQueuedRequests": 1024},
        }}
    assert gateway["digest"].startswith("sha256:")


def test_served_names_key_the_models_and_point_at_the_process() -> None:
    models = MODELS.replace("{model: org/m2,", "{served_model_name: org-m2-chat, model: org/m2,")
    doc = rendered(GATEWAY_PLACEMENT.replace("[m2, 9002]", "[m2, 9002, second]"), models=models)
    assert doc["gateway"]["models"] == {"m1": "m1", "org-m2-chat": "second"}
    assert doc["gateway"]["config"]["models"]["org-m2-chat"] == {
        "url": "http://127.0.0.1:9002", "headers": {"Authorization": "Bearer ${cred:bearer-second}"},
        "maxConcurrentRequests": 1024, "maxQueuedRequests": 1024}


@pytest.mark.parametrize(("vllm", "slots"), [
    ("settings: {max-num-seqs: 48}", 48),
    ("args: --max-num-seqs 12", 12),
    ("args: [--max_num_seqs, '20']", 20),
    ("args: --max-num-seqs=24", 24),
    ("args: --enable-prefix-caching", VLLM_DEFAULT_MAX_NUM_SEQS),
])
def test_each_models_slots_are_what_its_vllm_batches(vllm: str, slots: int) -> None:
    """The gateway admits as many requests to a model at once as its vLLM batches (--max-num-seqs from the
    recipe, else vLLM's default), and queues as many again: a burst vLLM would take gets no 503."""
    models = MODELS.replace("    vllm: {model: org/m2, vram_gb: 30, disk_gb: 40}",
                            f"    vllm:\n      model: org/m2\n      vram_gb: 30\n      {vllm}")
    result = validate(placement=GATEWAY_PLACEMENT, models=models)
    assert result.fleet is not None, [d.text() for d in result.diagnostics]
    config = render_box(result.fleet, BOX, BEARERS)["gateway"]["config"]
    assert config["models"]["m2"]["maxConcurrentRequests"] == slots
    assert config["models"]["m2"]["maxQueuedRequests"] == slots
    assert config["models"]["m1"]["maxConcurrentRequests"] == VLLM_DEFAULT_MAX_NUM_SEQS
    parsed = parse_config(json.dumps(config), expand_secrets=False)
    assert {m.name: m.max_concurrent for m in parsed.models}["m2"] == slots


def test_the_gateways_own_default_is_vllms() -> None:
    assert DEFAULT_MAX_CONCURRENT == VLLM_DEFAULT_MAX_NUM_SEQS == 1024


def test_no_bearer_in_the_config() -> None:
    doc = rendered()
    text = json.dumps(doc["gateway"]["config"])
    assert "sk-vllm-" not in text and TEST_SALT not in json.dumps(doc)


def test_the_gateway_digest_follows_its_bearers_and_config_but_not_live_fields() -> None:
    base = rendered()["gateway"]["digest"]
    assert rendered(bearers=Bearers(Salt("another-salt-value-0001")))["gateway"]["digest"] != base
    moved = rendered(GATEWAY_PLACEMENT.replace("[m2, 9002]", "[m2, 9003]"))["gateway"]["digest"]
    assert moved != base
    live = rendered(models=MODELS + "    litellm:\n      model_info: {input_cost_per_token: 1.0e-07}\n")
    assert live["gateway"]["digest"] == base


def test_a_gateway_changes_the_servers_digests() -> None:
    without = rendered("hosts:\n  203.0.113.10:\n    servers:\n      - [m1, 8002]\n")
    with_gateway = rendered("hosts:\n  203.0.113.10:\n    gateway: 8001\n    servers:\n      - [m1, 8002]\n")
    assert without["servers"][0]["api_key"] == with_gateway["servers"][0]["api_key"]
    assert "listen_host" not in without["servers"][0] and "gateway" not in without
    assert without["servers"][0]["digest"] != with_gateway["servers"][0]["digest"]


def test_example_gateway_box(tmp_path: Path) -> None:
    fleet = load(example_with_gateway(tmp_path / "fleet"))
    docs = render_all(fleet, BEARERS)
    assert [name for name, doc in docs.items() if "gateway" in doc] == [EXAMPLE_GATEWAY_BOX]
    gateway: Any = docs[EXAMPLE_GATEWAY_BOX]["gateway"]
    assert gateway["port"] == 8003
    assert gateway["models"] == {"qwen3-8b": "qwen3-8b", "qwen2.5-coder-7b": "qwen2.5-coder-7b"}


def write_configs(tmp_path: Path) -> list[Path]:
    """Every rendered gateway config: the helpers' box and the example's gateway box."""
    docs = [rendered(), render_box(load(example_with_gateway(tmp_path / "fleet")), EXAMPLE_GATEWAY_BOX, BEARERS)]
    paths = []
    for i, doc in enumerate(docs):
        path = tmp_path / f"gateway-{i}.json"
        path.write_text(json.dumps(doc["gateway"]["config"]))
        paths.append(path)
    return paths


def test_the_gateway_accepts_every_rendered_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path in write_configs(tmp_path):
        assert fleetllm(["gateway", "--check", "--box-json", "--config", str(path)]) == 0  # as the installer runs it
        assert "valid (2 models, 2 listed)" in capsys.readouterr().out


def test_the_credentials_resolve_to_the_bearers(tmp_path: Path) -> None:
    """The installer's file names and the renderer's references agree: expanded, the config holds the
    right bearer for each model."""
    doc = rendered()
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "client-token").write_text(doc["gateway"]["api_key"] + "\n")
    for server in doc["servers"]:
        (credentials / f"bearer-{server['name']}").write_text(server["api_key"])
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps(doc["gateway"]["config"]))
    config = load_config(path, env={"CREDENTIALS_DIRECTORY": str(credentials)})
    assert config.auth_tokens == (doc["gateway"]["api_key"],)
    injected = {m.name: dict(m.headers)["Authorization"] for m in config.models}
    assert injected == {s["served_model_name"]: f"Bearer {s['api_key']}" for s in doc["servers"]}
