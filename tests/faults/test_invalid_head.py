"""An invalid head never stops reconciling (issue 14, item 7): `fleetllm reconcile --once` processes (what
the systemd timer and the Kubernetes CronJob run) against the real LiteLLM proxy (or, without one, the
in-memory fake of its API), a real git repository and stub vLLM processes on 127.0.0.6.

Revision A (tiny-a on s1, tiny-b on s2) is reconciled; then an invalid commit lands on the branch and
tiny-a's server crashes. The passes go on with A: tiny-a's deployment is deleted after
down_after_failures (2) failed probes, exactly as with a valid head, tiny-b's stays, and each pass
exits 3 (the documented status for "ran on the last valid commit"), or 0 with --invalid-head-exit 0.
The pass record and the metrics file name the invalid head.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fleetllm.adapters.state import open_reconcile_state
from fleetllm.core.fleet.bearer import Salt
from tests.conftest import git
from tests.reconcile.procs import Stub
from tests.support.litellm import LitellmProxy
from tests.support.plane import FLEETLLM
from tests.support.ports import free_ports

BOX = "127.0.0.6"
SALT = "head-salt-0123456789abcdef"

pytestmark = pytest.mark.slow


def write_fleet(repo: Path, ports: list[int], placement: str) -> str:
    (repo / "fleet.yaml").write_text(
        f"version: 1\nfleet_id: test-fleet\nlisten_ports: [{', '.join(map(str, ports))}]\n"
        "reconcile:\n  probe_timeout_s: 2\n  down_after_failures: 2\n  up_after_successes: 1\n"
        "  max_deletes_per_pass: 10\n  max_delete_fraction: 1.0\n")
    (repo / "models.yaml").write_text(
        "models:\n"
        "  tiny-a:\n    vllm: {model: org/tiny-a, max_model_len: 4096}\n"
        "  tiny-b:\n    vllm: {model: org/tiny-b, max_model_len: 4096}\n")
    (repo / "placement.yaml").write_text(placement)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "fleet")
    return git(repo, "rev-parse", "HEAD")


def managed(proxy: LitellmProxy) -> dict[str, str]:
    return {str(r["model_info"]["id"]): str(r["model_name"]) for r in proxy.deployments()
            if (r.get("model_info") or {}).get("managed_by") == "fleetllm"}


def test_an_invalid_head_during_a_crash_still_deletes_the_crashed_servers_deployment(
        upstream: LitellmProxy, tmp_path: Path) -> None:
    s1, s2 = ports = free_ports(BOX, BOX)
    repo = tmp_path / "fleet"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    rev_a = write_fleet(repo, ports, f"hosts:\n  {BOX}:\n    - [tiny-a, {s1}]\n    - [tiny-b, {s2}]\n")
    salt = Salt(SALT)
    stubs = {s1: Stub(BOX, s1, "org/tiny-a", "tiny-a", salt.derive(BOX, s1)),
             s2: Stub(BOX, s2, "org/tiny-b", "tiny-b", salt.derive(BOX, s2))}
    config = tmp_path / "control-plane.yaml"
    config.write_text(f"repo: {{path: '{repo}', branch: main}}\nsecrets: {{vllm_api_salt: '${{env:IH_SALT}}'}}\n"
                      f"state: {{url: 'sqlite:///{tmp_path}/state.sqlite3'}}\n"
                      f"litellm: {{url: '{upstream.url}', master_key: '${{env:IH_KEY}}'}}\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "IH_SALT": SALT, "IH_KEY": upstream.master_key}
    metrics = tmp_path / "reconcile.prom"

    def reconcile(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(FLEETLLM), "reconcile", "--once", "--config", str(config),
                               "--metrics-file", str(metrics), *extra],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False)

    a_id, b_id = f"fleetllm:{BOX}:{s1}", f"fleetllm:{BOX}:{s2}"
    try:
        first = reconcile()
        assert first.returncode == 0, first.stdout + first.stderr
        assert managed(upstream) == {a_id: "tiny-a", b_id: "tiny-b"}
        assert "fleetllm_last_attempted_revision_valid 1.0" in metrics.read_text()

        # A bad commit on the branch (a model the catalog does not have), and tiny-a's server crashes.
        rev_b = write_fleet(repo, ports, f"hosts:\n  {BOX}:\n    - [no-such-model, {s1}]\n    - [tiny-b, {s2}]\n")
        stubs.pop(s1).kill()

        once = reconcile()
        assert once.returncode == 3, once.stdout + once.stderr
        assert f"the branch head {rev_b[:12]} is not valid" in once.stderr
        assert f"the last valid commit {rev_a[:12]}" in once.stderr
        assert "unknown model" in once.stderr  # the head's own diagnostics, as `fleetllm validate` prints them
        assert "Traceback" not in once.stderr
        assert managed(upstream) == {a_id: "tiny-a", b_id: "tiny-b"}  # one failed probe: not Down yet

        twice = reconcile()
        assert twice.returncode == 3, twice.stdout + twice.stderr
        assert managed(upstream) == {b_id: "tiny-b"}  # Down after down_after_failures: deleted on schedule

        exposition = metrics.read_text()
        assert "fleetllm_last_attempted_revision_valid 0.0" in exposition
        assert "fleetllm_reconcile_invalid_head_passes_total 1.0" in exposition  # a counter per --once process
        record = open_reconcile_state(f"sqlite:///{tmp_path}/state.sqlite3").recent_passes(1)[0]
        assert (record.revision, record.head, record.head_valid) == (rev_a, rev_b, False)
        assert any("no-such-model" in error for error in record.head_errors)
        assert record.ok

        # A scheduler that counts only 0 as success (a Kubernetes Job) asks for 0.
        assert reconcile("--invalid-head-exit", "0").returncode == 0

        # The fix lands: the head is valid again, and so is the exit status.
        write_fleet(repo, ports, f"hosts:\n  {BOX}:\n    - [tiny-b, {s2}]\n")
        fixed = reconcile()
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        assert "is not valid" not in fixed.stderr
        assert "fleetllm_last_attempted_revision_valid 1.0" in metrics.read_text()
    finally:
        for stub in stubs.values():
            stub.kill()
