"""The installer against the real vLLM: from the box JSON a real `fleetllm serve` answers, the programs it
writes make a real supervisord start two real `vllm serve` processes on one box (conftest.py), in order on
their shared card, with the bearer only in their environment."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from tests.realvllm.conftest import BOX, KV_CACHE_BYTES, MAX_NUM_SEQS, RealBox


def get(url: str, bearer: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {bearer}"} if bearer else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())


def test_both_programs_run_the_real_vllm_with_the_recipes_flags(real_box: RealBox) -> None:
    assert real_box.supervisor is not None
    states = real_box.supervisor.states()
    assert sorted(states) == ["fleetllm-tiny-a", "fleetllm-tiny-b"] and set(states.values()) == {"RUNNING"}
    for model, port in real_box.ports.items():
        pid = real_box.program_pid(model)
        assert pid is not None
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        # The launcher exec'd vLLM in place: Supervisor's process *is* `vllm serve` (the harness's).
        assert Path(argv[0]).name.startswith("python") and argv[1].endswith("/vllm") and argv[2] == "serve"
        assert argv[3] == str(real_box.harness.model)
        joined = " ".join(argv)
        for flag in (f"--host {BOX}", f"--port {port}", f"--served-model-name {model}", "--max-model-len 512",
                     f"--kv-cache-memory-bytes {KV_CACHE_BYTES}", f"--max-num-seqs {MAX_NUM_SEQS}"):
            assert flag in joined, (flag, joined)


def test_the_bearer_guards_v1_and_reaches_vllm_only_through_its_environment(real_box: RealBox) -> None:
    for model in real_box.ports:
        bearer = real_box.bearer(model)
        assert get(real_box.url(model) + "/v1/models") == (401, b'{"error":"Unauthorized"}')
        assert get(real_box.url(model) + "/v1/models", "sk-not-the-bearer-000")[0] == 401
        status, body = get(real_box.url(model) + "/v1/models", bearer)
        assert status == 200
        [card] = json.loads(body)["data"]
        assert (card["id"], card["root"], card["max_model_len"]) == (model, str(real_box.harness.model), 512)
        assert get(real_box.url(model) + "/health") == (200, b"")
    # Not on any command line on the machine (world-readable /proc/*/cmdline), not in any program file
    # but its own 0600 file; but in each vLLM's environment, with the CPU settings the "template" gave.
    bearers = [real_box.bearer(m).encode() for m in real_box.ports]
    seen = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        assert not any(b in cmdline for b in bearers), f"a bearer on the command line of pid {proc.name}"
        seen += 1
    assert seen > 10
    for model in real_box.ports:
        pid = real_box.program_pid(model)
        environ = dict(item.split("=", 1) for item in
                       Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in item)
        assert environ["VLLM_API_KEY"] == real_box.bearer(model)
        assert environ["FLEETLLM_SERVER"] == model
        for key, value in real_box.harness.box_env().items():
            assert environ.get(key) == value, key
        assert "FLEETLLM_FLEET_KEY" not in environ or environ["FLEETLLM_FLEET_KEY"] == ""
        assert "VLLM_CPU_KVCACHE_SPACE" not in environ  # it would override the recipe's --kv-cache-memory-bytes
    log = (real_box.root / "box" / "data" / "fleetllm" / "logs" / "tiny-a.log").read_text(errors="replace")
    assert "Explicitly set (0.06/" in log  # GiB of KV cache: the recipe's 64 MiB, not env.sh's 1 GiB
    conf_dir = real_box.root / "box" / "conf.d"
    for path in conf_dir.glob("fleetllm-*.conf"):
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        assert "--api-key" not in path.read_text()


def test_the_second_server_starts_only_after_the_first_is_healthy(real_box: RealBox) -> None:
    """Startup ordering on a shared card, with the real vLLM's "refused until ready": while tiny-a refuses
    connections, tiny-b's program is still the launcher (waiting), and tiny-b's port refuses too; only once
    tiny-a answers /health does tiny-b's program become `vllm serve`."""
    timeline = real_box.timeline
    first_a_ready = next(i for i, s in enumerate(timeline) if s.a == "200")
    before = timeline[:first_a_ready]
    assert len(before) >= 10, "the watcher saw tiny-a load"  # tens of seconds of loading, sampled every 0.25 s
    assert {s.a for s in before} == {"refused"}, {s.a for s in before}  # no 503 phase: nothing listens
    assert {s.b_program for s in before} <= {"launcher", "none"}, {s.b_program for s in before}
    assert {s.b for s in before} == {"refused"}
    assert "vllm" in {s.b_program for s in timeline[first_a_ready:]}
    assert real_box.ready_s["tiny-b"] > real_box.ready_s["tiny-a"]
    log = (real_box.root / "box" / "data" / "fleetllm" / "logs" / "tiny-b.log").read_text(errors="replace")
    assert "tiny-b: waiting for tiny-a to answer /health" in log
    assert log.index("tiny-b: tiny-a healthy") < log.index("tiny-b: starting")


def test_memory_of_the_box(real_box: RealBox) -> None:
    """Not a pass/fail figure: the resident memory of both servers' process trees, for docs/benchmarks.md."""
    rss = real_box.rss_mib()
    print(f"\nreal vLLM box: {len(real_box.vllm_pids())} processes, RSS {rss} MiB; ready after "
          f"{real_box.ready_s} s; load {os.getloadavg()}")
    assert rss > 0
