"""`fleetllm sync | suspend | resume | pin | unpin | control` end to end, with real parts: the control plane
as a process (`fleetllm serve`) over a real git repository, a real reconcile loop (`fleetllm reconcile`,
a pass every hour, so any pass within seconds is one a sync asked for) sharing its SQLite state store,
LiteLLM's model API as the project's HTTP test double (tests/reconcile/fakes.FakeLitellmHttp), stub vLLM
processes on 127.0.0.6, and every command run as the CLI, through the admin API with an admin token
from the environment.

- sync: a pass starts within seconds (the loop takes the request from the store);
- suspend: the next pass observes and records, and writes nothing to LiteLLM (a new server is not
  created); /health and /metrics say so; resume: the next pass creates it;
- pin REV: every box is served REV's JSON, the reconciler works from REV; an invalid, unknown or
  foreign revision is refused with a clear error; unpin: the newest valid revision again;
- the audit trail names who (the token's fingerprint), when and why, and no command line, log or answer
  holds the admin token.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetllm.adapters.state import open_store
from fleetllm.adapters.state.passes import PassRecord
from fleetllm.core.fleet.bearer import Salt
from fleetllm.demo.procs import stop
from fleetllm.server.auth import token_fingerprint
from tests.conftest import git
from tests.reconcile.fakes import FakeLitellmHttp
from tests.reconcile.procs import Stub
from tests.support.plane import FLEETLLM, ControlPlane, request
from tests.support.ports import free_ports
from tests.support.write_killer import ThreadedServer

BOX = "127.0.0.6"
FLEET_KEY = "fk-control-Wd3Nq8Lp2Rv6Zs1T"
SALT = "salt-control-Kc7Vb2Mx9Qh4Jn"
ADMIN = "admin-control-Tg6Ye1Ua8Pk3Ws"
VIEWER = "viewer-control-Bn5Hc2Lq7Dz4"
MASTER = "sk-control-master-Fr9Xt2"
SECRETS = (FLEET_KEY, SALT, ADMIN, VIEWER, MASTER)
PROMPT_S = 30.0  # a pass within this long of a sync is the sync's: the schedule's next one is an hour away

pytestmark = pytest.mark.slow


def write_fleet(repo: Path, ports: list[int], rows: list[tuple[str, int]], *, broken: bool = False) -> str:
    (repo / "fleet.yaml").write_text(
        f"version: 1\nfleet_id: test-fleet\nlisten_ports: [{', '.join(map(str, ports))}]\n"
        "reconcile:\n  probe_timeout_s: 2\n  down_after_failures: 1\n  up_after_successes: 1\n"
        "  max_deletes_per_pass: 10\n  max_delete_fraction: 1.0\n" + ("  nonsense_key: 1\n" if broken else ""))
    (repo / "models.yaml").write_text(
        "models:\n  tiny-a:\n    vllm: {model: org/tiny-a, max_model_len: 4096}\n"
        "  tiny-b:\n    vllm: {model: org/tiny-b, max_model_len: 4096}\n")
    (repo / "placement.yaml").write_text(
        f"hosts:\n  {BOX}:\n" + "".join(f"    - [{model}, {port}]\n" for model, port in rows))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", f"{len(rows)} server(s){' (broken)' if broken else ''}")
    return git(repo, "rev-parse", "HEAD")


@dataclass
class World:
    tmp: Path
    repo: Path
    plane: ControlPlane
    litellm: FakeLitellmHttp
    env: dict[str, str]
    ports: list[int]
    loop: subprocess.Popen[bytes] | None = None

    @property
    def loop_log(self) -> Path:
        return self.tmp / "reconcile.log"

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(FLEETLLM), *args, "--url", self.plane.url], env=self.env, cwd=self.tmp,
                              capture_output=True, text=True, timeout=120, check=False)

    def passes(self) -> list[PassRecord]:
        store = open_store(f"sqlite:///{self.tmp / 'state.sqlite3'}")
        try:
            return store.recent_passes(100)
        finally:
            store.close()

    def wait_for_pass(self, after: int, timeout_s: float = PROMPT_S) -> tuple[PassRecord, float]:
        """The first pass recorded after the `after` passes already there, and how long it took to come."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            found = self.passes()
            if len(found) > after:
                return found[len(found) - after - 1], time.monotonic() - started
            if self.loop is not None and self.loop.poll() is not None:
                raise AssertionError(f"the reconcile loop exited:\n{self.loop_log.read_text()[-4000:]}")
            time.sleep(0.2)
        raise AssertionError(f"no pass within {timeout_s} s:\n{self.loop_log.read_text()[-4000:]}")

    def box_config(self) -> tuple[int, dict[str, str], Any]:
        status, headers, body = request(self.plane.url + "/vllm/config",
                                        {"Authorization": f"Bearer {FLEET_KEY}", "X-LLMAO-Host": BOX})
        return status, headers, json.loads(body)

    def deployments(self) -> set[str]:
        return set(self.litellm.rows)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    ports = free_ports(BOX, BOX)
    repo = tmp_path / "fleet"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_fleet(repo, ports, [("tiny-a", ports[0])])
    litellm = FakeLitellmHttp(master_key=MASTER)
    salt = Salt(SALT)
    stubs = [Stub(BOX, ports[0], "org/tiny-a", "tiny-a", salt.derive(BOX, ports[0])),
             Stub(BOX, ports[1], "org/tiny-b", "tiny-b", salt.derive(BOX, ports[1]))]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "FK": FLEET_KEY, "SALT": SALT,
           "ADMIN": ADMIN, "VIEWER": VIEWER, "MASTER": MASTER, "FLEETLLM_ADMIN_TOKEN": ADMIN}
    with ThreadedServer(litellm.app()) as server:
        document = {"repo": {"path": str(repo), "branch": "main", "refresh_interval_s": 3600},
                    "secrets": {"fleet_key": "${env:FK}", "vllm_api_salt": "${env:SALT}"},
                    "state": {"url": f"sqlite:///{tmp_path / 'state.sqlite3'}"},
                    "admin_tokens": ["${env:ADMIN}"], "viewer_tokens": ["${env:VIEWER}"],
                    "litellm": {"url": server.url, "master_key": "${env:MASTER}"}}
        plane = ControlPlane(tmp_path, document, env).start()
        built = World(tmp_path, repo, plane, litellm, env, ports)
        try:
            yield built
        finally:
            if built.loop is not None:
                stop(built.loop, timeout_s=15)
            plane.stop()
            for stub in stubs:
                stub.kill()


def start_loop(world: World) -> None:
    with world.loop_log.open("ab") as log:
        world.loop = subprocess.Popen([str(FLEETLLM), "reconcile", "--config", str(world.plane.config),
                                       "--interval", "3600"], env=world.env, cwd=world.tmp, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)


def wait(what: str, check: Callable[[], bool], timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.2)


def test_sync_suspend_resume_pin_unpin_end_to_end(world: World) -> None:
    p1, p2 = world.ports
    id_a, id_b = f"fleetllm:{BOX}:{p1}", f"fleetllm:{BOX}:{p2}"
    start_loop(world)
    first, _ = world.wait_for_pass(0)  # the loop's first pass, at its start
    rev_a = first.revision
    assert world.deployments() == {id_a}

    # suspend: the next pass (asked for with sync) observes and records, and writes nothing
    done = world.cli("suspend", "--reason", "LiteLLM maintenance")
    assert done.returncode == 0, done.stderr
    assert "SUSPENDED" in done.stdout
    status, _, health = world.plane.get("/health")
    assert json.loads(health)["control"]["suspended"] is True
    assert "fleetllm_suspended 1.0" in world.plane.get("/metrics")[2].decode()
    rev_b = write_fleet(world.repo, world.ports, [("tiny-a", p1), ("tiny-b", p2)])
    before = len(world.passes())
    done = world.cli("sync", "--reason", "pick up tiny-b")
    assert done.returncode == 0, done.stderr
    suspended_pass, sync_s = world.wait_for_pass(before)
    assert suspended_pass.revision == rev_b  # observed and judged the new commit ...
    assert suspended_pass.mode == "suspended"  # ... and acted on nothing, recorded as such (not as a dry run)
    assert [a.id for a in suspended_pass.actions] == [id_b]
    assert world.deployments() == {id_a}
    assert '"reconcile_suspended"' in world.loop_log.read_text()

    # resume: the next pass creates tiny-b's deployment
    done = world.cli("resume")
    assert done.returncode == 0, done.stderr
    before = len(world.passes())
    assert world.cli("sync").returncode == 0
    resumed, _ = world.wait_for_pass(before)
    assert resumed.mode == "apply"
    assert world.deployments() == {id_a, id_b}

    # pin: refused for an unknown, an invalid and a foreign revision; then A is served to the box
    rev_bad = write_fleet(world.repo, world.ports, [("tiny-a", p1), ("tiny-b", p2)], broken=True)
    git(world.repo, "checkout", "-q", "-b", "side", rev_a)
    rev_side = write_fleet(world.repo, world.ports, [("tiny-b", p2)])
    git(world.repo, "checkout", "-q", "main")
    for rev, says in (("0123456789abcdef0123", "no such commit"),
                      (rev_bad, "is not a valid fleet revision"),
                      (rev_side, "is not in the history of branch main")):
        done = world.cli("pin", rev, "--reason", "x")
        assert done.returncode != 0, (rev, done.stdout)
        assert says in done.stderr, (rev, done.stderr)
        assert "Traceback" not in done.stderr
    status, headers, served = world.box_config()
    assert served["revision"] == rev_b  # the newest valid commit (the head is invalid)

    done = world.cli("pin", rev_a[:10], "--reason", "tiny-b misbehaves")
    assert done.returncode == 0, done.stderr
    assert f"pinned to {rev_a}" in done.stdout
    status, headers, served = world.box_config()
    assert status == 200 and headers["X-Fleet-Revision"] == rev_a == served["revision"]
    assert [s["port"] for s in served["servers"]] == [p1]
    status, _, health = world.plane.get("/health")
    assert json.loads(health)["control"]["pinned_revision"] == rev_a == json.loads(health)["revision"]
    before = len(world.passes())
    assert world.cli("sync").returncode == 0
    pinned_pass, _ = world.wait_for_pass(before)
    assert pinned_pass.revision == rev_a  # the reconciler's intended state follows the pin
    assert '"reconcile_pinned"' in world.loop_log.read_text()

    # unpin: the newest valid commit again, for boxes and for the reconciler
    done = world.cli("unpin", "--reason", "fixed")
    assert done.returncode == 0, done.stderr
    assert world.box_config()[2]["revision"] == rev_b
    before = len(world.passes())
    assert world.cli("sync").returncode == 0
    assert world.wait_for_pass(before)[0].revision == rev_b
    wait("tiny-b's deployment back", lambda: world.deployments() == {id_a, id_b})

    # the audit trail: who, when, why
    done = world.cli("control", "--format", "json")
    assert done.returncode == 0, done.stderr
    audit = json.loads(done.stdout)["audit"]
    actor = "admin:" + token_fingerprint(ADMIN)
    assert [(e["action"], e["actor"]) for e in reversed(audit)] == [
        ("suspend", actor), ("sync", actor), ("resume", actor), ("sync", actor), ("pin", actor), ("sync", actor),
        ("unpin", actor), ("sync", actor)]
    assert [e["reason"] for e in reversed(audit)][:2] == ["LiteLLM maintenance", "pick up tiny-b"]
    assert next(e for e in audit if e["action"] == "pin")["revision"] == rev_a

    # a viewer token may look, not act
    viewer_env = {**world.env, "FLEETLLM_ADMIN_TOKEN": VIEWER}
    done = subprocess.run([str(FLEETLLM), "suspend", "--url", world.plane.url], env=viewer_env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode != 0 and "HTTP 403" in done.stderr and "Traceback" not in done.stderr

    time.sleep(0.6)  # the server writes its log in batches
    for text in (world.plane.log.read_text(), world.loop_log.read_text()):
        for secret in SECRETS:
            assert secret not in text
    print(f"figure: fleetllm sync -> the pass it asked for recorded after {sync_s:.2f} s (loop interval 3600 s)")


def test_sync_wait_waits_for_the_rollout_of_the_revision_it_serves(world: World) -> None:
    """`fleetllm sync --wait` after a merge, as CI runs it: the sync's pass rolls the new commit out (no box
    has the agent, so it converges in that pass) and the command exits 0 once the rollout says so;
    `rollout wait` of a commit that never comes times out with 2."""
    p1, p2 = world.ports
    start_loop(world)
    world.wait_for_pass(0)
    rev_b = write_fleet(world.repo, world.ports, [("tiny-a", p1), ("tiny-b", p2)])
    done = world.cli("sync", "--wait", "--timeout", "120", "--interval", "0.5", "--reason", "CI after merge")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert f"waiting for the rollout of {rev_b[:12]}" in done.stdout
    assert f"converged: every agent-managed box runs {rev_b[:12]}" in done.stdout
    assert world.passes()[0].revision == rev_b
    never = world.cli("rollout", "wait", "0123abcd", "--timeout", "1", "--interval", "0.5")
    assert never.returncode == 2 and "has not started" in never.stdout and "timed out" in never.stdout
    for output in (done.stdout + done.stderr, never.stdout + never.stderr):
        assert ADMIN not in output
