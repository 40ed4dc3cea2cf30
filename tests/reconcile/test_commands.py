"""The plan/apply/reconcile commands' contract without a LiteLLM: errors are one clear line and exit 1,
an invalid fleet is never planned, nothing secret is printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .fakes import free_port

ROOT = Path(__file__).resolve().parents[2]
SALT = "cmd-salt-0123456789abcdef"


def fleetllm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetllm", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=120, check=False)


def config(tmp_path: Path, litellm_url: str, legacy: bool = True) -> Path:
    path = tmp_path / "cp.yaml"
    legacy_ref = ", legacy_api_key: '${env:FLEETLLM_LEGACY_API_KEY}'" if legacy else ""
    path.write_text(f"litellm: {{url: '{litellm_url}', master_key: '${{env:T_MK}}'}}\n"
                    f"secrets: {{vllm_api_salt: '${{env:T_SALT}}'{legacy_ref}}}\n"
                    f"repo: {{path: '{tmp_path}'}}\n"
                    f"state: {{url: 'sqlite:///{tmp_path}/state.db'}}\n")
    return path


METRICS_TOKEN = "reconcile-loop-metrics-token-0123"
ENV = {"T_MK": "sk-master-cmd-secret", "T_SALT": SALT, "FLEETLLM_LEGACY_API_KEY": "sk-legacy-cmd-secret",
       "T_METRICS": METRICS_TOKEN}


def test_plan_needs_the_legacy_key_for_legacy_servers(fleet_dir: Path, tmp_path: Path) -> None:
    cfg = config(tmp_path, f"http://127.0.0.1:{free_port()}", legacy=False)
    result = fleetllm("plan", "--config", str(cfg), "--repo", str(fleet_dir), env=ENV)
    assert result.returncode == 1
    assert "legacy" in result.stderr
    assert "Traceback" not in result.stderr


def test_plan_output_names_the_failure_and_holds_everything(fleet_dir: Path, tmp_path: Path) -> None:
    (fleet_dir / "fleet.yaml").write_text((fleet_dir / "fleet.yaml").read_text().replace(
        "legacy_servers:\n  - host: 198.51.100.23\n    port: 8000\n    note: pre-salt box; retire after the migration\n",
        ""))
    (fleet_dir / "placement.yaml").write_text((fleet_dir / "placement.yaml").read_text().split(
        "  # Legacy pair")[0])
    cfg = config(tmp_path, f"http://127.0.0.1:{free_port()}")
    cfg.write_text(cfg.read_text() + "providers: {vast: {api_key: '${env:T_VAST}', url: 'http://127.0.0.1:"
                   f"{free_port()}'}}}}\n")
    result = fleetllm("plan", "--config", str(cfg), "--repo", str(fleet_dir), env={**ENV, "T_VAST": "vast-secret"})
    assert result.returncode == 1, result.stderr
    out = result.stdout
    assert "Observation errors:" in out
    assert "LiteLLM listing" in out
    assert "No plan: LiteLLM's deployments are not known" in out
    assert "No changes" not in out  # it used to say "No changes. LiteLLM has a deployment exactly for ..." too
    assert out.rstrip().endswith("Plan: none (LiteLLM's deployments are not known; nothing would be written).")
    # the failed Vast listing and the RunPod box without a key price nothing: named, not counted as free
    assert ("Cost: $0.00/h for 0 rented box(es), from the providers' listings; no price read for 203.0.113.24, "
            "k7v2m9x4q1w8e3 (not counted).") in out
    for secret in ("sk-master-cmd-secret", "vast-secret", SALT):
        assert secret not in out + result.stderr


def test_an_invalid_fleet_is_never_planned(fleet_dir: Path, tmp_path: Path) -> None:
    (fleet_dir / "placement.yaml").write_text("hosts:\n  203.0.113.10:\n    - [no-such-model, 8001]\n")
    cfg = config(tmp_path, "http://127.0.0.1:9")
    result = fleetllm("apply", "--yes", "--config", str(cfg), "--repo", str(fleet_dir), env=ENV)
    assert result.returncode == 1
    assert "unknown model" in result.stderr
    assert "is not valid" in result.stderr


def test_a_literal_secret_in_the_config_is_refused(tmp_path: Path, fleet_dir: Path) -> None:
    cfg = tmp_path / "cp.yaml"
    cfg.write_text("litellm: {url: 'http://127.0.0.1:9', master_key: sk-literal-master}\n"
                   "secrets: {vllm_api_salt: '${env:T_SALT}'}\nrepo: {path: /tmp}\nstate: {url: 'sqlite:///s.db'}\n")
    result = fleetllm("plan", "--config", str(cfg), "--repo", str(fleet_dir), env=ENV)
    assert result.returncode == 1
    assert "litellm/master_key" in result.stderr
    assert "sk-literal-master" not in result.stderr


def test_reconcile_loop_runs_passes_until_sigterm_and_two_loops_never_overlap(fleet_dir: Path,
                                                                                tmp_path: Path) -> None:
    import json
    import signal
    import time

    placement = (fleet_dir / "placement.yaml").read_text().split("  # Legacy pair")[0]
    (fleet_dir / "placement.yaml").write_text(placement)
    (fleet_dir / "fleet.yaml").write_text((fleet_dir / "fleet.yaml").read_text().split("legacy_servers:")[0]
                                         + "fleet_id: example\n")  # what the cut-off tail said
    cfg = config(tmp_path, f"http://127.0.0.1:{free_port()}")
    cfg.write_text(cfg.read_text() + "metrics_token: '${env:T_METRICS}'\n")  # /metrics for that bearer only
    lock = tmp_path / "pass.lock"
    metrics_port = free_port()
    args = [sys.executable, "-m", "fleetllm", "reconcile", "--config", str(cfg), "--repo", str(fleet_dir),
            "--interval", "1", "--lock-file", str(lock), "--metrics-listen", f"127.0.0.1:{metrics_port}"]
    env = {**os.environ, **ENV}
    first = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not lock.exists():
            time.sleep(0.1)
        time.sleep(3)
        import urllib.error
        import urllib.request

        with pytest.raises(urllib.error.HTTPError) as refused:  # no token: 401, no metric
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
        assert refused.value.code == 401 and b"fleetllm_" not in refused.value.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/health/live", timeout=10) as response:
            assert response.read() == b"ok\n"  # the pod's probes send no token
        scrape = urllib.request.Request(f"http://127.0.0.1:{metrics_port}/metrics",
                                        headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
        with urllib.request.urlopen(scrape, timeout=10) as response:
            exposition = response.read().decode()
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    passes = [e for e in events if e["event"] == "reconcile_pass"]
    assert len(passes) >= 2
    assert all(not p["ok"] and p["errors"] for p in passes)  # LiteLLM unreachable: failed, and nothing deleted
    assert all(p["actions"] == [] for p in passes)
    assert events[-1]["event"] == "reconcile_stopped"
    assert 'fleetllm_reconcile_passes_total{outcome="error"}' in exposition
    # LiteLLM only: a provider without a key is no error (its boxes are dialled at their listen ports)
    assert "fleetllm_reconcile_last_pass_errors 1.0" in exposition
    assert "fleetllm_litellm_up 0.0" in exposition  # the pass could not list its deployments
    assert "sk-master-cmd-secret" not in err

    holder = subprocess.Popen([sys.executable, "-c", "import sys,time\nfrom fleetllm.job.loop import "
                               "pass_lock\nwith pass_lock(sys.argv[1]):\n print('held', flush=True)\n time.sleep(60)",
                               str(lock)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        once = fleetllm("reconcile", "--once", "--config", str(cfg), "--repo", str(fleet_dir), "--lock-file",
                        str(lock), env=ENV)
    finally:
        holder.kill()
        holder.wait()
    assert once.returncode == 0
    assert "reconcile_pass_skipped" in once.stderr


def test_plan_against_a_revision_reads_that_commit(fleet_git: Path, tmp_path: Path) -> None:
    from tests.conftest import git

    base = git(fleet_git, "rev-parse", "HEAD")
    (fleet_git / "placement.yaml").write_text("hosts:\n  203.0.113.10:\n    - [qwen3-8b, 8001]\n")
    git(fleet_git, "commit", "-qam", "one box")
    cfg = config(tmp_path, f"http://127.0.0.1:{free_port()}")
    result = fleetllm("plan", "--config", str(cfg), "--repo", str(fleet_git), "--against", "HEAD", env=ENV)
    assert f"revision {git(fleet_git, 'rev-parse', 'HEAD')[:12]}" in result.stdout
    assert "203.0.113.24" not in result.stdout
    result = fleetllm("plan", "--config", str(cfg), "--repo", str(fleet_git), "--against", base, env=ENV)
    assert f"revision {base[:12]}" in result.stdout
    assert "203.0.113.24:8002" in result.stdout


def no_litellm_config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "cp.yaml"
    path.write_text(f"secrets: {{vllm_api_salt: '${{env:T_SALT}}', legacy_api_key: '${{env:FLEETLLM_LEGACY_API_KEY}}'}}\n"
                    f"repo: {{path: '{tmp_path}'}}\nstate: {{url: 'sqlite:///{tmp_path}/state.db'}}\n{extra}")
    return path


def test_plan_without_litellm_shows_the_verdicts_and_says_what_it_cannot(fleet_dir: Path, tmp_path: Path) -> None:
    # The demo's config without LiteLLM and examples/control-plane.yaml used to stop at "the reconciler needs a
    # litellm section".
    cfg = no_litellm_config(tmp_path)
    result = fleetllm("plan", "--config", str(cfg), "--repo", str(fleet_dir), env=ENV)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "needs a litellm section" not in out + result.stderr
    assert "Servers:" in out
    assert ("No plan: LiteLLM's deployments are not known (no LiteLLM: the control plane's config has no litellm "
            "section, so the boxes route (their gateway, or a balancer in front of them) and the rollout restarts them "
            "without LiteLLM). The verdicts above are this pass's own") in out
    assert "whether LiteLLM routes to them is unknown" in out
    # The example's Vast box, with no Vast key: dialled at its listen port, with the warning.
    assert "Warnings:\n  ! vast box(es) 203.0.113.24: no vast key configured (providers.vast): public port " in out


def test_apply_refuses_without_litellm_and_both_when_disabled(fleet_dir: Path, tmp_path: Path) -> None:
    cfg = no_litellm_config(tmp_path)
    result = fleetllm("apply", "--yes", "--config", str(cfg), "--repo", str(fleet_dir), env=ENV)
    assert result.returncode == 1
    assert (f"`fleetllm apply` writes to LiteLLM, and {cfg} has no litellm section (url, master_key): "
            "add one.") in result.stderr
    assert "`fleetllm reconcile` runs the rollouts without it (the boxes route)" in result.stderr
    once = fleetllm("reconcile", "--once", "--config", str(cfg), "--repo", str(fleet_dir), env=ENV)
    assert "writes to LiteLLM" not in once.stderr and "LiteLLM listing" not in once.stdout + once.stderr
    assert (tmp_path / "state.db").exists()  # the pass ran and was recorded: the rollouts run without LiteLLM
    (tmp_path / "state.db").unlink()
    disabled = config(tmp_path, f"http://127.0.0.1:{free_port()}")
    disabled.write_text(disabled.read_text() + "reconcile: {enabled: false}\n")
    for command in (["apply", "--yes"], ["reconcile", "--once"]):
        result = fleetllm(*command, "--config", str(disabled), "--repo", str(fleet_dir), env=ENV)
        assert result.returncode == 1
        assert f"reconcile.enabled is false in {disabled}: the reconciler is switched off" in result.stderr
        assert not (tmp_path / "state.db").exists()  # refused before the state store was opened
    plan = fleetllm("plan", "--config", str(disabled), "--repo", str(fleet_dir), env=ENV)
    assert "reconcile.enabled" not in plan.stderr and "Servers:" in plan.stdout
