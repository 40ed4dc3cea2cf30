"""The reconciler against the real vLLM and the real LiteLLM: verdicts (Loading, Healthy, Foreign, Down)
from `fleetllm plan`/`apply` processes probing the real servers, deployments created, kept and deleted in
the real LiteLLM proxy, and chat completions (plain and streamed) sent to LiteLLM reaching the real vLLM.

Order matters inside this module (one box for the session): the SIGKILL test comes last and waits for
the server to come back before it ends."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from typing import Any

from tests.installer.realprocs import wait_until
from tests.realvllm.conftest import RealBox, post_json

PROMPT = [{"role": "user", "content": "Hello"}]


def verdicts(output: str) -> dict[str, tuple[str, str]]:
    document, _ = json.JSONDecoder().raw_decode(output[output.index("{"):])  # stderr may follow
    return {s["model"]: (s["verdict"], s["reason"]) for s in document["servers"]}


def plan(real_box: RealBox, config: Any = None) -> dict[str, tuple[str, str]]:
    code, out = real_box.fleetllm("plan", "--format", "json", config=config)
    assert code == 0, out
    return verdicts(out)


def managed(real_box: RealBox) -> dict[str, str]:
    return {r["model_info"]["id"]: r["model_name"] for r in real_box.litellm.deployments()
            if r["model_info"].get("managed_by") == "fleetllm"}


def successes(real_box: RealBox, model: str) -> float:
    """vllm:request_success_total of one real server, summed over its finish reasons (no key needed)."""
    with urllib.request.urlopen(real_box.url(model) + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


def ids(real_box: RealBox) -> dict[str, str]:
    return {f"fleetllm:127.0.0.2:{port}": model for model, port in real_box.ports.items()}


def test_loading_while_vllm_builds_its_engine(real_box: RealBox) -> None:
    """The plan taken right after the installer ran, while the real vLLMs refused connections."""
    seen = verdicts(real_box.loading_plan)
    assert {v for v, _ in seen.values()} == {"Loading"}, seen
    assert all("fetched its config" in reason for _, reason in seen.values())


def test_healthy_then_deployments_created_and_kept(real_box: RealBox) -> None:
    seen = plan(real_box)
    assert {m: v for m, (v, _) in seen.items()} == {"tiny-a": "Healthy", "tiny-b": "Healthy"}, seen
    code, out = real_box.fleetllm("apply", "--yes")
    assert code == 0, out
    assert managed(real_box) == ids(real_box)
    for row in real_box.litellm.deployments():
        if row["model_info"].get("managed_by") == "fleetllm":
            port = real_box.ports[row["model_name"]]
            assert row["litellm_params"]["api_base"].startswith(f"http://127.0.0.2:{port}")
    code, out = real_box.fleetllm("apply", "--yes")  # a second pass keeps them: nothing to do
    assert code == 0, out
    assert "No changes." in out, out
    assert managed(real_box) == ids(real_box)


def test_chat_through_litellm_reaches_the_real_vllm(real_box: RealBox) -> None:
    if managed(real_box) != ids(real_box):
        assert real_box.fleetllm("apply", "--yes")[0] == 0
    for model in real_box.ports:
        before = successes(real_box, model)
        status, answer = post_json(real_box.litellm.url + "/v1/chat/completions",
                                   {"model": model, "messages": PROMPT, "max_tokens": 8, "temperature": 0},
                                   real_box.litellm.master_key)
        assert status == 200, answer
        assert answer["object"] == "chat.completion"
        assert isinstance(answer["choices"][0]["message"]["content"], str)
        assert answer["usage"]["completion_tokens"] == 8  # random weights: the full max_tokens, "length"
        assert answer["choices"][0]["finish_reason"] == "length"
        assert successes(real_box, model) == before + 1  # the real server of that model answered it


def test_streamed_chat_through_litellm_reaches_the_real_vllm(real_box: RealBox) -> None:
    if managed(real_box) != ids(real_box):
        assert real_box.fleetllm("apply", "--yes")[0] == 0
    before = successes(real_box, "tiny-b")
    request = urllib.request.Request(
        real_box.litellm.url + "/v1/chat/completions", method="POST",
        data=json.dumps({"model": "tiny-b", "messages": PROMPT, "max_tokens": 6, "stream": True}).encode(),
        headers={"Authorization": f"Bearer {real_box.litellm.master_key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = [line.decode().strip() for line in response if line.strip()]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert sum(1 for p in pieces if p) >= 2  # token by token, as vLLM sent them (or merged when behind)
    finishes = [c["choices"][0].get("finish_reason") for c in chunks if c["choices"]]
    assert [f for f in finishes if f] == ["length"], chunks  # LiteLLM leaves the key out of most chunks
    assert successes(real_box, "tiny-b") == before + 1


def test_foreign_when_the_bearer_is_wrong(real_box: RealBox) -> None:
    """A reconciler whose salt derives other bearers gets vLLM's 401 from both servers: Foreign, and its
    plan would delete nothing it does not own and create nothing."""
    wrong = real_box.root / "control-plane-wrong-salt.yaml"
    wrong.write_text(real_box.plane_config(salt_var="FL_WRONG_SALT"))
    code, out = real_box.fleetllm("plan", "--format", "json", config=wrong,
                                  FL_WRONG_SALT="another-salt-for-realvllm-000000")
    assert code == 0, out
    seen = verdicts(out)
    assert {m: v for m, (v, _) in seen.items()} == {"tiny-a": "Foreign", "tiny-b": "Foreign"}, seen
    assert all("401" in reason for _, reason in seen.values()), seen


def test_down_after_sigkill_then_back(real_box: RealBox) -> None:
    """SIGKILL to tiny-b's whole vLLM (API server, EngineCore, Worker): Supervisor restarts it, but a real
    vLLM needs tens of seconds to listen again. Healthy through one failed probe, Down at the second, its
    deployment deleted while tiny-a's stays; back after two good probes once vLLM is up again."""
    code, out = real_box.fleetllm("apply", "--yes")
    assert code == 0, out
    assert managed(real_box) == ids(real_box)
    pid = real_box.program_pid("tiny-b")
    assert pid is not None
    assert os.getpgid(pid) == pid  # Supervisor starts each program in a process group of its own
    os.killpg(pid, signal.SIGKILL)  # vLLM's whole tree: API server, EngineCore, Worker (an OOM kill's aftermath)
    killed_at = time.monotonic()
    wait_until("tiny-b refusing", lambda: real_box.health("tiny-b") == "refused", 30)
    code, out = real_box.fleetllm("apply", "--yes")
    assert code == 0, out
    assert "1 failed probe(s) in a row" in out, out
    code, out = real_box.fleetllm("apply", "--yes")
    assert code == 0, out
    b_id = f"fleetllm:127.0.0.2:{real_box.ports['tiny-b']}"
    assert f"- deployment {b_id}" in out, out
    assert managed(real_box) == {k: v for k, v in ids(real_box).items() if v == "tiny-a"}
    seen = plan(real_box)
    assert seen["tiny-b"][0] == "Down" and seen["tiny-a"][0] == "Healthy", seen
    assert real_box.health("tiny-b") != "200", "vLLM came back before the reconciler judged it Down"
    down_within_s = time.monotonic() - killed_at

    real_box.wait_healthy("tiny-b")
    back_after_s = time.monotonic() - killed_at
    assert real_box.program_kind("tiny-b") == "vllm" and real_box.program_pid("tiny-b") != pid
    code, out = real_box.fleetllm("apply", "--yes")
    assert code == 0, out
    assert b_id not in managed(real_box)  # one good probe is not enough
    code, out = real_box.fleetllm("apply", "--yes")
    assert code == 0, out
    assert managed(real_box) == ids(real_box)
    print(f"\ntiny-b: Down and deleted {down_within_s:.1f} s after the SIGKILL; serving again after "
          f"{back_after_s:.1f} s (Supervisor's restart)")
