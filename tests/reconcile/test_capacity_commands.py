"""`fleetllm plan` and `apply` with capacity declared in fleet.yaml: rentals and terminations listed like creates
and destroys with their prices, `apply` asks first, and a pool's rental is terminated only once its box retired.
Real parts: a fleet git repository, `fleetllm` processes (on a pseudo-terminal where a person would answer), the
RunPod fake (held to RunPod's published documents: tests/contracts/test_provider_rentals.py), LiteLLM's fake."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetllm.adapters.state import open_store
from fleetllm.core.boxreport import BoxReport
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.jsonvalue import freeze_mapping
from fleetllm_contract.report import ReportOutcome
from tests.conftest import git
from tests.reconcile.fakes import FakeLitellmHttp, FakeRunPod, free_port, runpod_gpu
from tests.reconcile.procs import Stub
from tests.reconcile.test_apply_confirm import BOX, apply
from tests.reconcile.test_commands import fleetllm
from tests.reconcile.test_cost import POOLS
from tests.reconcile.test_loop_real import SALT, commit, write_fleet
from tests.support.write_killer import ThreadedServer

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[FakeRunPod, Path, Path, dict[str, str]]]:
    port = free_port(BOX)
    repo = tmp_path / "fleet"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_fleet(repo, [port], {BOX: [("tiny-a", port)]})
    (repo / "fleet.yaml").write_text((repo / "fleet.yaml").read_text() + POOLS.replace("COUNT", "1"))
    commit(repo, "one box, one H100 pool")
    litellm = FakeLitellmHttp(master_key="sk-capacity-master-0123")
    runpod = FakeRunPod(catalog=[runpod_gpu(H100, "H100 SXM", 2.69)], api_key="rp-capacity-secret-key")
    stub = Stub(BOX, port, "org/tiny-a", "tiny-a", Salt(SALT).derive(BOX, port))
    try:
        with ThreadedServer(litellm.app()) as lserver, ThreadedServer(runpod.app()) as rserver:
            config = tmp_path / "control-plane.yaml"
            config.write_text(f"litellm: {{url: '{lserver.url}', master_key: '${{env:T_MK}}'}}\n"
                              "secrets: {vllm_api_salt: '${env:T_SALT}'}\n"
                              f"providers: {{runpod: {{api_key: '${{env:T_RP}}', url: '{rserver.url}'}}}}\n"
                              f"repo: {{path: '{repo}', branch: main}}\n"
                              f"state: {{url: 'sqlite:///{tmp_path}/state.db'}}\n")
            yield runpod, config, repo, {**os.environ, "T_MK": litellm.master_key, "T_SALT": SALT,
                                         "T_RP": runpod.api_key}
    finally:
        stub.kill()


def test_plan_lists_the_rental_with_its_price_and_apply_asks_then_rents(
        world: tuple[FakeRunPod, Path, Path, dict[str, str]]) -> None:
    runpod, config, repo, env = world
    result = fleetllm("plan", "--config", str(config), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "+ rent 1 × H100 SXM on RunPod for pool h100 as fleetllm-h100-1: +$2.69/h" in result.stdout
    assert "Capacity: 1 to rent, 0 to terminate; rented boxes $0.00/h -> $2.69/h" in result.stdout
    assert runpod.pods == [] and runpod.api_key not in result.stdout + result.stderr
    result = fleetllm("plan", "--config", str(config), "--format", "json", env=env)
    capacity = json.loads(result.stdout)["capacity"]
    assert [(r["label"], r["per_hour"], r["ask"]) for r in capacity["rentals"]] == [("fleetllm-h100-1", 2.69, H100)]
    assert (capacity["terminations"], capacity["after_per_hour"]) == ([], 2.69)
    code, out = apply(config, env, answer="no")
    assert code == 1 and "Apply cancelled" in out and runpod.pods == []
    assert out.index("+ rent") < out.index("Do you want to perform these actions?")
    code, out = apply(config, env, answer="yes")
    assert code == 0, out
    [pod] = runpod.pods
    assert (pod["name"], pod["template"], pod["gpu"]) == ("fleetllm-h100-1", "tmpl", {"id": H100, "count": 1})
    assert f"ok     rent fleetllm-h100-1 (runpod {H100}): runpod id {pod['id']}, box fleetllm-h100-1" in out
    assert pod["env"] == {"LLMAO_HOST": "fleetllm-h100-1"}  # the box presents itself under its label
    assert runpod.violations == []
    result = fleetllm("plan", "--config", str(config), env=env)  # rented: nothing more to rent
    assert "Capacity: 0 to rent, 0 to terminate; rented boxes $2.69/h -> $2.69/h" in result.stdout

    # count 0: the box must retire before it is terminated (it never reported empty: held)
    (repo / "fleet.yaml").write_text((repo / "fleet.yaml").read_text().replace("count: 1", "count: 0"))
    commit(repo, "no more H100")
    result = fleetllm("plan", "--config", str(config), env=env)
    assert f"held terminate runpod {pod['id']} ({pod['id']}): pool h100 declares fewer boxes; waiting for it to " \
           "retire" in result.stdout
    code, out = apply(config, env, "--yes")
    assert code == 0, out
    assert [p["id"] for p in runpod.pods] == [pod["id"]]  # nothing terminated

    store = open_store(f"sqlite:///{config.parent}/state.db")
    try:  # the box reports it runs nothing (what a retired box's agent does with its empty box JSON)
        store.record_report(BoxReport(pod["id"], 1.0, "198.51.100.9", "r" * 40, "1.0", ReportOutcome.INSTALLED,
                                      freeze_mapping({"servers": []})), keep=5)
    finally:
        store.close()
    result = fleetllm("plan", "--config", str(config), env=env)
    assert f"- terminate runpod {pod['id']} ({pod['id']}, pool h100 declares fewer boxes): -$2.69/h" in result.stdout
    code, out = apply(config, env, answer="yes")
    assert code == 0, out
    assert runpod.pods == [] and runpod.terminated == [pod["id"]]
    assert f"ok     terminate runpod {pod['id']}" in out
