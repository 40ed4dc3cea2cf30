"""The reconciler process killed (SIGKILL) right after its k-th LiteLLM write, for every k, then run
again: `fleetllm apply` processes against the real LiteLLM proxy (or, without one, the in-memory fake
of its API), through tests/support/write_killer.py, with stub vLLM processes on 127.0.0.4.

Revision A (tiny-a on s1 and s2, tiny-b on s3) is applied first. Revision B drops s3, adds s4
(tiny-b) and changes tiny-a's LiteLLM route: 4 writes (1 create, 2 updates, 1 delete). For k = 1..4
the apply of B (one write at a time) is killed after the k-th write reached LiteLLM, and once more
with 4 writes at a time; a new apply then converges (a plan
after it has no changes), no deployment exists twice, only s3's deployment is ever deleted, and the
hand-made deployment is never written. The in-memory property over random worlds is
tests/reconcile/test_properties.py::test_crash_after_every_kth_action_then_a_new_pass_converges.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetllm.core.fleet.bearer import Salt
from tests.conftest import git
from tests.reconcile.procs import Stub
from tests.support.litellm import LitellmProxy, proxy_from_env
from tests.support.plane import FLEETLLM
from tests.support.ports import free_ports
from tests.support.write_killer import ThreadedServer, WriteKiller

BOX = "127.0.0.4"
SALT = "crash-salt-0123456789abcdef"
WRITES_OF_B = 4
HAND_MADE = "test-hand-made-crash"

pytestmark = pytest.mark.slow


def write_fleet(repo: Path, ports: list[int], rows: list[tuple[str, int]], window: int) -> str:
    (repo / "fleet.yaml").write_text(
        f"version: 1\nfleet_id: test-fleet\nlisten_ports: [{', '.join(map(str, ports))}]\n"
        "reconcile:\n  probe_timeout_s: 2\n  down_after_failures: 2\n  up_after_successes: 1\n"
        "  max_deletes_per_pass: 10\n  max_delete_fraction: 1.0\n")
    (repo / "models.yaml").write_text(
        "models:\n"
        f"  tiny-a:\n    vllm: {{model: org/tiny-a, max_model_len: 4096}}\n"
        f"    litellm: {{model_info: {{context_window: {window}}}}}\n"
        "  tiny-b:\n    vllm: {model: org/tiny-b, max_model_len: 4096}\n")
    (repo / "placement.yaml").write_text(
        f"hosts:\n  {BOX}:\n" + "".join(f"    - [{model}, {port}, p{port}]\n" for model, port in rows))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", f"fleet with {len(rows)} servers")
    return git(repo, "rev-parse", "HEAD")


def deployments(proxy: LitellmProxy) -> list[dict[str, object]]:
    return [r for r in proxy.deployments() if str((r.get("model_info") or {}).get("id", "")).startswith(
        ("fleetllm:", "test-"))]


# About 60 s alone and 113 s on a loaded 2-core machine: its own budget, above the suite's 300 s hang guard.
@pytest.mark.timeout(900)
def test_killed_after_every_kth_write_then_restarted(upstream: LitellmProxy, tmp_path: Path,
                                                    figures: Callable[..., None]) -> None:
    ports = free_ports(BOX, BOX, BOX, BOX)
    s1, s2, s3, s4 = ports
    repo = tmp_path / "fleet"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    rev_a = write_fleet(repo, ports, [("tiny-a", s1), ("tiny-a", s2), ("tiny-b", s3)], 4096)
    rev_b = write_fleet(repo, ports, [("tiny-a", s1), ("tiny-a", s2), ("tiny-b", s4)], 2048)
    salt = Salt(SALT)
    stubs = [Stub(BOX, p, f"org/{m}", m, salt.derive(BOX, p))
             for p, m in ((s1, "tiny-a"), (s2, "tiny-a"), (s3, "tiny-b"), (s4, "tiny-b"))]
    killer = WriteKiller(upstream.url)
    rows = []
    try:
        with ThreadedServer(killer.app()) as proxy:
            env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CR_SALT": SALT, "CR_KEY": upstream.master_key}
            # One write at a time: the apply dies with exactly k writes done. Then 4 at once: the k-th
            # lands while others are in flight (they land too, unanswered).
            for k, concurrency in [*((k, 1) for k in range(1, WRITES_OF_B + 1)), (1, 4)]:
                rows.append(one_crash(k, concurrency, upstream, killer, proxy.url, repo,
                                      tmp_path / f"k{k}-c{concurrency}", env, (rev_a, rev_b),
                                      {s1: "tiny-a", s2: "tiny-a", s4: "tiny-b"}, s3))
    finally:
        for stub in stubs:
            stub.kill()
    figures(case="SIGKILL after the k-th write", upstream="real LiteLLM" if proxy_from_env() else "fake", runs=rows)


def one_crash(k: int, concurrency: int, upstream: LitellmProxy, killer: WriteKiller, proxy_url: str, repo: Path,
              work: Path, env: dict[str, str], revisions: tuple[str, str], want: dict[int, str],
              dropped: int) -> dict[str, object]:
    rev_a, rev_b = revisions
    upstream.reset()
    status, body = upstream.call("POST", "/model/new", {
        "model_name": "hand", "litellm_params": {"model": "openai/hand", "api_base": f"http://{BOX}:9/v1"},
        "model_info": {"id": HAND_MADE}})
    assert status == 200, body
    work.mkdir()
    config = work / "control-plane.yaml"
    config.write_text(f"repo: {{path: '{repo}', branch: main}}\nsecrets: {{vllm_api_salt: '${{env:CR_SALT}}'}}\n"
                      f"state: {{url: 'sqlite:///{work}/state.sqlite3'}}\n"
                      f"litellm: {{url: '{proxy_url}', master_key: '${{env:CR_KEY}}', write_concurrency: {concurrency}}}\n")

    def fleetllm(*args: str, kill_at: int | None = None) -> tuple[subprocess.CompletedProcess[str], int]:
        process = subprocess.Popen([str(FLEETLLM), *args, "--config", str(config)], env=env, cwd=work,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        killer.arm(kill_at, process.pid)
        out, _ = process.communicate(timeout=180)
        killer.arm(None, None)
        return subprocess.CompletedProcess(process.args, process.returncode, out), process.pid

    done, _ = fleetllm("apply", "--yes", "--rev", rev_a)
    assert done.returncode == 0, done.stdout
    hand = next(r for r in deployments(upstream) if r["model_info"]["id"] == HAND_MADE)  # type: ignore[index]
    killer.writes.clear()
    crashed, crashed_pid = fleetllm("apply", "--yes", "--rev", rev_b, kill_at=k)
    assert crashed.returncode == -9, crashed.stdout
    restarted, restarted_pid = fleetllm("apply", "--yes", "--rev", rev_b)
    assert restarted.returncode == 0, restarted.stdout
    assert killer.count(crashed_pid) == k if concurrency == 1 else killer.count(crashed_pid) >= k
    plan, _ = fleetllm("plan", "--rev", rev_b, "--detailed-exitcode")
    assert plan.returncode == 0, plan.stdout
    assert "No changes." in plan.stdout

    rows = deployments(upstream)
    ids = Counter(str(r["model_info"]["id"]) for r in rows)  # type: ignore[index]
    assert all(n == 1 for n in ids.values()), ids
    bases = Counter(str(r["litellm_params"].get("api_base")) for r in rows)  # type: ignore[union-attr]
    assert all(n == 1 for n in bases.values()), bases  # one deployment per server
    managed = {str(r["model_info"]["id"]): r["model_name"] for r in rows  # type: ignore[index]
               if r["model_info"].get("managed_by") == "fleetllm"}  # type: ignore[union-attr]
    assert managed == {f"fleetllm:{BOX}:{p}": m for p, m in want.items()}
    assert all(r["model_info"].get("context_window") == 2048 for r in rows  # type: ignore[union-attr]
               if r["model_name"] == "tiny-a")
    assert next(r for r in rows if r["model_info"]["id"] == HAND_MADE) == hand  # type: ignore[index]
    kinds = Counter(kind for _, kind, _ in killer.writes)
    assert kinds["delete"] <= 1 and f"fleetllm:{BOX}:{dropped}" not in managed
    upstream.call("POST", "/model/delete", {"id": HAND_MADE})
    return {"k": k, "write_concurrency": concurrency, "writes_of_killed_apply": killer.count(crashed_pid),
            "writes_of_restarted_apply": killer.count(restarted_pid), "deletes": kinds["delete"],
            "restart_exit": restarted.returncode, "plan_exit": plan.returncode}
