"""A batch pass hands its metrics over (issue 18, alerts): `fleetllm reconcile --once` processes, as the
CronJob and the systemd timer run them, against a real git fleet repository, a stub vLLM on 127.0.0.9,
LiteLLM (the real proxy when the environment names one, else the fake of its API), and

- a real Prometheus Pushgateway (Debian's prometheus-pushgateway) on a loopback port: the pass's gauges
  arrive in the group job="fleetllm_reconcile", instance=<reconcile.pushgateway.instance>, a second run
  replaces the group (PUT), basic auth from secret references reaches it, and a dead Pushgateway leaves
  the pass's exit status as it was, within the push timeout, saying so on stderr without the URL's
  credential;
- a real node_exporter (prometheus-node-exporter) with only its textfile collector, reading the file the
  pass wrote (reconcile.metrics_file).

Gated like the promtool tests: without the binaries the test skips, under FLEETLLM_REQUIRE_INTEGRATION=1
it fails (tests/support/integration.py)."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetllm.adapters.state import open_store
from fleetllm.core.fleet.bearer import Salt
from tests.conftest import git
from tests.reconcile.procs import Stub
from tests.support.integration import missing
from tests.support.litellm import LitellmProxy
from tests.support.plane import FLEETLLM, free_port
from tests.support.ports import free_ports
from tests.support.upstream import litellm_upstream

BOX = "127.0.0.9"
SALT = "push-salt-0123456789abcdef"
JOB = "fleetllm_reconcile"

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def binary(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:  # .ci/run installs Debian's package, which ships it
        missing(f"{name} is not installed (apt-get install --no-install-recommends {package})")
    return path


class Daemon:
    """A real exporter process on a loopback port, waited for, killed after the test."""

    def __init__(self, argv: list[str], port: int, log: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/metrics", timeout=1):
                    return
            except OSError:
                if self.process.poll() is not None:
                    break
                time.sleep(0.05)
        self.stop()
        raise AssertionError(f"{argv[0]} did not come up on {self.url}:\n{log.read_text()}")

    def families(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """Every sample on /metrics by name: [(labels, value)]."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as answer:
            text = answer.read().decode()
        found: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
        return found

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)


def value(families: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    matching = [v for got, v in families.get(name, []) if all(got.get(k) == w for k, w in labels.items())]
    assert len(matching) == 1, f"{name}{labels}: {families.get(name)}"
    return matching[0]


@pytest.fixture
def pushgateway(tmp_path: Path) -> Iterator[Daemon]:
    port = free_port("127.0.0.1")
    daemon = Daemon([binary("prometheus-pushgateway", "prometheus-pushgateway"),
                     f"--web.listen-address=127.0.0.1:{port}"], port, tmp_path / "pushgateway.log")
    yield daemon
    daemon.stop()


@pytest.fixture
def upstream() -> Iterator[LitellmProxy]:
    """The real LiteLLM when the environment names one, else the fake of its API (tests/support/upstream.py)."""
    with litellm_upstream("sk-push-fake-master-Qe7Lw") as proxy:
        yield proxy


class Fleet:
    """A git fleet repository with tiny-a served by a stub vLLM (and tiny-b placed on a port nobody
    serves), and the control-plane config around it."""

    def __init__(self, tmp_path: Path, upstream: LitellmProxy) -> None:
        self.tmp_path = tmp_path
        self.served, self.dead = free_ports(BOX, BOX)
        self.repo = tmp_path / "fleet"
        self.repo.mkdir()
        git(self.repo, "init", "-q", "-b", "main")
        self.commit(f"hosts:\n  {BOX}:\n    - [tiny-a, {self.served}]\n    - [tiny-b, {self.dead}]\n")
        self.stub = Stub(BOX, self.served, "org/tiny-a", "tiny-a", Salt(SALT).derive(BOX, self.served))
        self.upstream = upstream
        self.config = tmp_path / "control-plane.yaml"
        self.env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PM_SALT": SALT,
                    "PM_KEY": upstream.master_key}

    def commit(self, placement: str) -> None:
        ports = [self.served, self.dead]
        (self.repo / "fleet.yaml").write_text(
            f"version: 1\nfleet_id: test-fleet\nlisten_ports: [{', '.join(map(str, ports))}]\n"
            "reconcile:\n  probe_timeout_s: 2\n  down_after_failures: 1\n  up_after_successes: 1\n"
            "  max_deletes_per_pass: 10\n  max_delete_fraction: 1.0\n")
        (self.repo / "models.yaml").write_text(
            "models:\n"
            "  tiny-a:\n    vllm: {model: org/tiny-a, max_model_len: 4096}\n"
            "  tiny-b:\n    vllm: {model: org/tiny-b, max_model_len: 4096}\n")
        (self.repo / "placement.yaml").write_text(placement)
        git(self.repo, "add", "-A")
        git(self.repo, "commit", "-qm", "fleet")

    def configure(self, reconcile: str) -> None:
        tmp = self.tmp_path
        self.config.write_text(
            f"repo: {{path: '{self.repo}', branch: main}}\nsecrets: {{vllm_api_salt: '${{env:PM_SALT}}'}}\n"
            f"state: {{url: 'sqlite:///{tmp}/state.sqlite3'}}\n"
            f"litellm: {{url: '{self.upstream.url}', master_key: '${{env:PM_KEY}}'}}\n" + reconcile)

    def reconcile(self, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(FLEETLLM), "reconcile", "--once", "--config", str(self.config), *extra],
                              env={**self.env, **(env or {})}, cwd=self.tmp_path, capture_output=True, text=True,
                              timeout=180, check=False)

    def close(self) -> None:
        self.stub.kill()


@pytest.fixture
def fleet(tmp_path: Path, upstream: LitellmProxy) -> Iterator[Fleet]:
    made = Fleet(tmp_path, upstream)
    yield made
    made.close()


def test_a_once_pass_pushes_its_gauges_and_the_next_run_replaces_the_group(pushgateway: Daemon,
                                                                         fleet: Fleet) -> None:
    fleet.configure(f"reconcile:\n  pushgateway: {{url: '{pushgateway.url}', instance: prod-fleet}}\n")
    before = time.time()
    first = fleet.reconcile()
    assert first.returncode == 0, first.stdout + first.stderr
    assert "metrics_push_failed" not in first.stderr

    got = pushgateway.families()
    group = {"job": JOB, "instance": "prod-fleet"}
    started = value(got, "fleetllm_reconcile_last_pass_timestamp_seconds", **group)
    assert before - 1 <= started <= time.time()
    assert value(got, "fleetllm_reconcile_last_success_timestamp_seconds", **group) == started
    assert value(got, "fleetllm_reconcile_passes_total", outcome="ok", **group) == 1
    assert value(got, "fleetllm_model_intended_servers", model="tiny-a", **group) == 1
    assert value(got, "fleetllm_model_serving_servers", model="tiny-a", **group) == 1
    assert value(got, "fleetllm_model_serving_servers", model="tiny-b", **group) == 0
    assert value(got, "fleetllm_litellm_up", **group) == 1
    assert value(got, "fleetllm_rollout_halted", **group) == 0
    assert value(got, "fleetllm_last_attempted_revision_valid", **group) == 1
    assert value(got, "push_time_seconds", **group) >= before - 1  # the Pushgateway's own, per group

    # The next run replaces the group (PUT): tiny-b left the fleet, so its series are gone, not stale.
    fleet.commit(f"hosts:\n  {BOX}:\n    - [tiny-a, {fleet.served}]\n")
    second = fleet.reconcile()
    assert second.returncode == 0, second.stdout + second.stderr
    got = pushgateway.families()
    assert value(got, "fleetllm_reconcile_last_pass_timestamp_seconds", **group) > started
    assert value(got, "fleetllm_reconcile_passes_total", outcome="ok", **group) == 1  # one pass per process
    assert value(got, "fleetllm_model_serving_servers", model="tiny-a", **group) == 1
    assert not [labels for labels, _ in got["fleetllm_model_serving_servers"] if labels["model"] == "tiny-b"]
    assert not [labels for labels, _ in got.get("fleetllm_model_intended_servers", [])
                if labels["model"] == "tiny-b"]
    assert {labels["instance"] for labels, _ in got["fleetllm_reconcile_last_pass_timestamp_seconds"]} == \
        {"prod-fleet"}  # one group for the fleet, whatever pod or host ran the pass

    # A suspended fleet's pass (it observes and records, writes nothing) is pushed too, and says so.
    second_at = value(got, "fleetllm_reconcile_last_pass_timestamp_seconds", **group)
    store = open_store(f"sqlite:///{fleet.tmp_path}/state.sqlite3")
    assert store.suspend("admin:test", time.time(), "LiteLLM upgrade")
    suspended = fleet.reconcile()
    assert suspended.returncode == 0, suspended.stdout + suspended.stderr
    got = pushgateway.families()
    assert value(got, "fleetllm_reconcile_suspended", **group) == 1
    assert value(got, "fleetllm_reconcile_last_pass_timestamp_seconds", **group) > second_at


def test_a_failed_pass_is_pushed_with_its_outcome_and_exit_status(pushgateway: Daemon, fleet: Fleet) -> None:
    """A pass with observation errors (LiteLLM down) still hands over what it saw: litellm_up 0, no new
    last_success, exit 1 as without the Pushgateway."""
    fleet.configure(f"reconcile:\n  pushgateway: {{url: '{pushgateway.url}', instance: prod-fleet}}\n")
    assert fleet.reconcile().returncode == 0
    ok_at = value(pushgateway.families(), "fleetllm_reconcile_last_success_timestamp_seconds")
    dead_litellm = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    fleet.config.write_text(fleet.config.read_text().replace(fleet.upstream.url, dead_litellm))
    failed = fleet.reconcile()
    assert failed.returncode == 1, failed.stdout + failed.stderr
    got = pushgateway.families()
    assert value(got, "fleetllm_litellm_up") == 0
    assert value(got, "fleetllm_reconcile_passes_total", outcome="error") == 1
    assert value(got, "fleetllm_reconcile_last_success_timestamp_seconds") == ok_at
    assert value(got, "fleetllm_reconcile_last_pass_timestamp_seconds") > ok_at


def test_basic_auth_from_secret_references_reaches_the_pushgateway(tmp_path: Path, fleet: Fleet) -> None:
    """A Pushgateway behind basic auth (its --web.config.file): username and password are secret
    references; without them the push is refused (401), logged without the password, and the pass exits 0."""
    web = tmp_path / "web.yml"
    # bcrypt of "push-password-7Hq2" (the Pushgateway's web config takes hashes only)
    hashed = subprocess.run([sys.executable, "-W", "ignore", "-c", "import crypt,sys; print(crypt.crypt(sys.argv[1], crypt.mksalt("
                             "crypt.METHOD_BLOWFISH)))", "push-password-7Hq2"], capture_output=True, text=True,
                            check=False).stdout.strip()
    if not hashed.startswith("$2"):
        pytest.fail(f"no bcrypt hash from python3's crypt module: {hashed!r}")
    web.write_text(f"basic_auth_users:\n  fleetllm: '{hashed}'\n")
    port = free_port("127.0.0.1")
    argv = [binary("prometheus-pushgateway", "prometheus-pushgateway"), f"--web.listen-address=127.0.0.1:{port}",
            f"--web.config.file={web}"]
    log = tmp_path / "pushgateway.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(url + "/-/healthy", timeout=1).close()
                break
            except urllib.error.HTTPError:
                break  # answering (401): up
            except OSError:
                time.sleep(0.05)
        fleet.configure(f"reconcile:\n  pushgateway: {{url: '{url}', instance: prod-fleet, "
                        "username: '${env:PM_PUSH_USER}', password: '${env:PM_PUSH_PASSWORD}'}\n")
        wrong = fleet.reconcile(env={"PM_PUSH_USER": "fleetllm", "PM_PUSH_PASSWORD": "not-the-password-Zx9"})
        assert wrong.returncode == 0, wrong.stdout + wrong.stderr
        assert "metrics_push_failed" in wrong.stderr
        assert "401" in wrong.stderr
        assert "not-the-password-Zx9" not in wrong.stdout + wrong.stderr

        right = fleet.reconcile(env={"PM_PUSH_USER": "fleetllm", "PM_PUSH_PASSWORD": "push-password-7Hq2"})
        assert right.returncode == 0, right.stdout + right.stderr
        assert "metrics_push_failed" not in right.stderr
        request = urllib.request.Request(url + "/metrics", headers={
            "Authorization": "Basic " + base64.b64encode(b"fleetllm:push-password-7Hq2").decode()})
        with urllib.request.urlopen(request, timeout=10) as answer:
            text = answer.read().decode()
        assert 'fleetllm_model_serving_servers{instance="prod-fleet",job="fleetllm_reconcile",model="tiny-a"} 1' \
            in text
    finally:
        process.kill()
        process.wait(timeout=10)


def test_a_dead_pushgateway_leaves_the_exit_status_and_says_so_quickly(fleet: Fleet) -> None:
    """Nothing listens at the URL (a refused connection) or it never answers (a silent listener): the pass
    exits as it would without a Pushgateway, the push giving up after timeout_s, and says so on stderr
    naming only the Pushgateway's host and port, never the credential in its URL."""
    import socket

    refused = free_port("127.0.0.1")
    fleet.configure("reconcile:\n  pushgateway: {url: '${env:PM_PUSH_URL}', instance: prod-fleet, timeout_s: 2}\n")
    done = fleet.reconcile(env={"PM_PUSH_URL": f"http://fleetllm:s3cret-in-url-Kp4@127.0.0.1:{refused}"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "metrics_push_failed" in done.stderr
    assert f"the Pushgateway http://127.0.0.1:{refused}" in done.stderr
    assert "s3cret-in-url-Kp4" not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr

    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        hung = fleet.reconcile(env={"PM_PUSH_URL": f"http://127.0.0.1:{port}"})
    assert hung.returncode == 0, hung.stdout + hung.stderr
    assert "metrics_push_failed" in hung.stderr
    assert "timed out" in hung.stderr  # the push gave up (timeout_s) instead of waiting for an answer


def test_node_exporter_exposes_the_textfile_the_pass_wrote(tmp_path: Path, fleet: Fleet) -> None:
    textfiles = tmp_path / "node-exporter"
    textfiles.mkdir()
    fleet.configure(f"reconcile:\n  metrics_file: {textfiles / 'fleetllm-reconcile.prom'}\n")
    done = fleet.reconcile()
    assert done.returncode == 0, done.stdout + done.stderr
    port = free_port("127.0.0.1")
    node = Daemon([binary("prometheus-node-exporter", "prometheus-node-exporter"),
                   f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults", "--collector.textfile",
                   f"--collector.textfile.directory={textfiles}"], port, tmp_path / "node-exporter.log")
    try:
        got = node.families()
    finally:
        node.stop()
    assert value(got, "node_textfile_scrape_error") == 0
    assert value(got, "fleetllm_model_serving_servers", model="tiny-a") == 1
    assert value(got, "fleetllm_model_serving_servers", model="tiny-b") == 0
    assert value(got, "fleetllm_litellm_up") == 1
    assert value(got, "fleetllm_reconcile_last_pass_timestamp_seconds") > 0
    assert [v for labels, v in got["node_textfile_mtime_seconds"]
            if labels.get("file", "").endswith("fleetllm-reconcile.prom")]

    # A pass skipped because another holds the lock writes nothing (it would replace the holder's gauges).
    (textfiles / "fleetllm-reconcile.prom").unlink()
    lock = tmp_path / "held.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl,sys,time; f=open(sys.argv[1],'w'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(lock)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        skipped = fleet.reconcile("--lock-file", str(lock))
    finally:
        holder.kill()
        holder.wait(timeout=10)
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "reconcile_pass_skipped" in skipped.stderr
    assert not (textfiles / "fleetllm-reconcile.prom").exists()
