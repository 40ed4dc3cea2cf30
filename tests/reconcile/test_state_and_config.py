"""The config-file reader, the single-flight file lock across processes, metrics and the structured
pass log. The store's own tests run on every engine in tests/state/test_reconcile_tables.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from fleetllm.adapters.state.passes import ActionRecord, PassRecord
from fleetllm.core.schedule import next_delay
from fleetllm.errors import ConfigurationError as ConfigError
from fleetllm.job.configfile import load_config
from fleetllm.job.loop import LockHeld, pass_lock
from fleetllm.job.metrics import PassMetrics

RECORD = PassRecord(100.0, 1.5, "a" * 40, "apply", {"Healthy": 2, "Down": 1},
                    (ActionRecord("delete", "fleetllm:b:8001", False, "failed", "HTTP 503"),), ("vast listing: x",))


def write_config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "cp.yaml"
    path.write_text(body)
    return path


GOOD = """
repo: {path: fleet, branch: main}
secrets: {fleet_key: "${env:FK}", vllm_api_salt: "${env:SALT}", legacy_api_key: "${env:LK}"}
state: {url: "sqlite:///../.state/cp.sqlite3"}
litellm: {url: "http://127.0.0.1:4000", master_key: "${env:MK}", write_concurrency: 4}
providers:
  vast: {api_key: "${file:%s}"}
  static: {}
"""
ENV = {"FK": "f", "SALT": "salt-0123456789abcdef", "LK": "sk-legacy", "MK": "sk-master"}


def test_config_is_the_control_planes(tmp_path: Path) -> None:
    """The reconciler reads `fleetllm serve`'s config: salt under secrets:, paths relative to the file."""
    (tmp_path / "vast.key").write_text("vast-secret\n")
    path = write_config(tmp_path, GOOD % (tmp_path / "vast.key"))
    config = load_config(path, ENV)
    assert config.litellm_master_key.reveal() == "sk-master"
    assert config.write_concurrency == 4
    assert config.legacy_key is not None
    assert config.legacy_key.reveal() == "sk-legacy"
    assert config.providers[next(iter(config.providers))].api_key.reveal() == "vast-secret"
    assert config.repo_path == str(tmp_path / "fleet")
    assert config.branch == "main"
    assert config.state_url == f"sqlite:///{tmp_path.parent / '.state' / 'cp.sqlite3'}"
    assert config.dry_run is False
    assert load_config(write_config(tmp_path, GOOD % (tmp_path / "vast.key") + "reconcile: {dry_run: true}\n"),
                       ENV).dry_run
    assert "sk-master" not in repr(config)
    assert "salt-0123" not in repr(config)


@pytest.mark.parametrize(("replace", "message"), [
    (('master_key: "${env:MK}"', "master_key: sk-literal-master"), "litellm/master_key"),
    (('master_key: "${env:MK}"', 'master_key: "${env:NOPE}"'), 'env var "NOPE"'),
])
def test_config_errors_name_the_key_and_never_the_secret(tmp_path: Path, replace: tuple[str, str],
                                                         message: str) -> None:
    path = write_config(tmp_path, (GOOD % (tmp_path / "vast.key")).replace(*replace))
    (tmp_path / "vast.key").write_text("vast-secret\n")
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(path, ENV)
    assert str(path) in str(caught.value)
    assert "sk-literal-master" not in str(caught.value)
    assert "sk-master" not in str(caught.value)


HOLDER = """
import sys, time
from fleetllm.job.loop import pass_lock
with pass_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(30)
"""


def test_lock_holds_across_processes(tmp_path: Path) -> None:
    lock = tmp_path / "reconcile.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2])
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockHeld), pass_lock(lock):
            pass
    finally:
        holder.kill()
        holder.wait()
    with pass_lock(lock):  # released when its holder died
        pass


def test_jitter_stays_within_ten_percent() -> None:
    delays = [next_delay(60) for _ in range(200)]
    assert all(60 <= d <= 66 for d in delays)
    assert len({round(d, 3) for d in delays}) > 1


def test_metrics_from_a_pass_record() -> None:
    metrics = PassMetrics()
    metrics.observe(RECORD)
    text = generate_latest(metrics.registry).decode()
    assert 'fleetllm_servers{verdict="Healthy"} 2.0' in text
    assert 'fleetllm_servers{verdict="Stalled"} 0.0' in text
    assert 'fleetllm_reconcile_actions_total{kind="delete",result="failed"} 1.0' in text
    assert 'fleetllm_reconcile_passes_total{outcome="error"} 1.0' in text
    assert "fleetllm_reconcile_last_pass_errors 1.0" in text


def test_pass_record_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    from fleetllm.job.loop import log_pass
    from fleetllm.logs import setup_logging

    setup_logging()  # what `fleetllm` does for every command: JSON lines on (captured) stderr
    log_pass(RECORD)
    line = json.loads(capsys.readouterr().err.strip())
    assert line["event"] == "reconcile_pass"
    assert line["ok"] is False
    assert line["verdicts"] == {"Healthy": 2, "Down": 1}
    assert line["actions"][0]["error"] == "HTTP 503"
    assert line["level"] == "error"  # a failed pass
    assert time.time() - datetime.fromisoformat(line["ts"]).timestamp() < 60  # ISO-8601, like every line
    assert line["started_at"] == "1970-01-01T00:01:40.000Z"  # the record's epoch 100.0, as the log writes time


def test_config_from_the_environment_for_ci_jobs() -> None:
    from fleetllm.core.fleet.model import Provider
    from fleetllm.job.configfile import config_from_env

    env = {"LITELLM_URL": "http://127.0.0.1:4000", "LITELLM_MASTER_KEY": "sk-m", "FLEETLLM_VLLM_API_SALT":
           "salt-0123456789abcdef", "VAST_API_KEY": "vk"}
    config = config_from_env(env)
    assert config.litellm_master_key.reveal() == "sk-m"
    assert set(config.providers) == {Provider.VAST}
    assert config.state_url is None
    with pytest.raises(ConfigError, match="LITELLM_MASTER_KEY"):
        config_from_env({"LITELLM_URL": "http://x"})
