"""Notifications end to end with real parts: the control plane as a process (`fleetllm serve`) over a
real git repository, real `fleetllm reconcile --once` processes sharing its SQLite state store, a fake
of LiteLLM's model API over HTTP, and a real receiver on loopback in this process taking both a
webhook target (bearer and header) and a Slack-compatible one (its URL a secret reference).

Each event that can be driven reaches the receiver: an invalid head (after a 503 that is retried),
models without a serving server, a failed pass, their resolved forms, and rollout_halted through the
notifier's emit. A second pass does not send again (the dedup state is in the store, shared by the
runs). A receiver that holds every answer neither holds a box's config fetch nor a pass. No secret
appears in any log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import yaml

from fleetllm.adapters.state import open_store
from fleetllm.adapters.state.notifications import SqlLedger
from fleetllm.core.notify import Event, EventKind
from fleetllm.settings import load_config, make_notifier
from tests.conftest import ROOT, git
from tests.faults.conftest import FLEET_KEY, PLANE_ENV, SALT, box_headers, plane_document, push_hook
from tests.installer.realprocs import wait_until
from tests.notify.receiver import Receiver, receiving
from tests.reconcile.fakes import FakeLitellmHttp, free_port
from tests.reconcile.test_loop_real import commit, write_fleet
from tests.support.plane import ControlPlane
from tests.support.write_killer import ThreadedServer

BEARER = "nb-real-Vq72KsLm39Xd"
HEADER_TOKEN = "nh-real-Jc54PwRt81Zy"
SLACK_PATH = "/services/T0REAL/B0REAL/slackpath-Hn6Gx2Qe"
MASTER_KEY = "sk-real-notify-master-Fz3Lw9"
ALL_EVENTS = ["invalid_commit", "pass_failed", "model_without_servers", "rollout_halted"]
SECRETS = (BEARER, HEADER_TOKEN, SLACK_PATH, MASTER_KEY, FLEET_KEY, SALT)


def kinds(receiver: Receiver, path: str) -> list[tuple[str, str, str]]:
    """(kind, subject, status) of what reached `path`, in order (Slack bodies: read from the key line)."""
    found = []
    for r in receiver.delivered(path):
        if "kind" in r.body:
            found.append((r.body["kind"], r.body["subject"], r.body["status"]))
        else:
            found.append(("slack", r.body["text"], ""))
    return found


class Run:
    """`fleetllm reconcile --once` as a process; every output kept for the secret check."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.outputs: list[str] = []

    def reconcile(self, config: Path) -> tuple[int, str]:
        done = subprocess.run([sys.executable, "-m", "fleetllm", "reconcile", "--once", "--config", str(config)],
                              env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
        self.outputs.append(done.stdout + done.stderr)
        return done.returncode, done.stdout + done.stderr


def test_notifications_reach_a_real_receiver(tmp_path: Path) -> None:
    gate = threading.Event()
    gate.set()  # open: answers go at once until the last part of the test closes it
    fake = FakeLitellmHttp(master_key=MASTER_KEY)
    with receiving(script=[503], gate=gate) as receiver, ThreadedServer(fake.app()) as litellm:
        scenario(tmp_path, receiver, gate, litellm.url)


def scenario(tmp: Path, receiver: Receiver, gate: threading.Event, litellm_url: str) -> None:
    p1, p2 = free_port("127.0.0.2"), free_port("127.0.0.3")
    repo = tmp / "fleet"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_fleet(repo, [p1, p2], {"127.0.0.2": [("tiny-a", p1)], "127.0.0.3": [("tiny-b", p2)]})
    commit(repo, "two boxes")
    notifications = {"targets": [
        {"name": "ops", "kind": "webhook", "url": receiver.url + "/hook", "bearer": "${env:NB}",
         "header": {"name": "X-Token", "value": "${env:NH}"}, "events": ALL_EVENTS},
        {"name": "chat", "kind": "slack", "url": "${env:SLACK_URL}", "events": ALL_EVENTS}],
        "drain_timeout_s": 20}
    document = plane_document(tmp / "plane", repo_path=repo, litellm={"url": litellm_url,
                                                                      "master_key": "${env:MK}"},
                              notifications=notifications)
    env = {**PLANE_ENV, "NB": BEARER, "NH": HEADER_TOKEN, "SLACK_URL": receiver.url + SLACK_PATH, "MK": MASTER_KEY}
    plane = ControlPlane(tmp / "plane", document, env)
    plane.start()
    try:
        story(tmp, receiver, gate, plane, repo, env, (p1, p2))
    finally:
        plane.stop()
    served = plane.log.read_text()
    for secret in SECRETS:
        assert secret not in served
        assert receiver.url not in served  # a target is named, never its URL


def story(tmp: Path, receiver: Receiver, gate: threading.Event, plane: ControlPlane, repo: Path,
          env: dict[str, str], ports: tuple[int, int]) -> None:
    p1, p2 = ports
    run = Run({**os.environ, **env})
    config = plane.config
    broken = tmp / "broken-litellm.yaml"  # the same control plane, LiteLLM unreachable
    broken_doc = yaml.safe_load(config.read_text())
    broken_doc["litellm"]["url"] = f"http://127.0.0.1:{free_port()}"
    broken.write_text(yaml.safe_dump(broken_doc))

    # A pass: no server answers, so both models are without a serving server; the first answer the
    # receiver gave was a 503, and that delivery was retried.
    code, out = run.reconcile(config)
    assert code == 0, out
    models = sorted(s for k, s, st in kinds(receiver, "/hook") if k == "model_without_servers" and st == "firing")
    assert models == ["tiny-a", "tiny-b"]
    assert len(receiver.delivered(SLACK_PATH)) == 2
    assert [r.status for r in receiver.received].count(503) == 1 and len(receiver.received) == 5
    first = receiver.delivered("/hook")[0]
    assert first.headers["Authorization"] == f"Bearer {BEARER}" and first.headers["X-Token"] == HEADER_TOKEN
    assert first.body["source"]["component"] == "reconciler" and first.body["details"]["servers"]
    assert "Model without servers" in receiver.delivered(SLACK_PATH)[0].body["text"]
    # A second pass, another process: the same conditions are not sent again (the store remembers).
    code, out = run.reconcile(config)
    assert code == 0, out
    assert len(receiver.delivered("/hook")) == 2 and len(receiver.delivered(SLACK_PATH)) == 2

    # A failed pass (LiteLLM unreachable), then one that succeeds: firing, then resolved.
    code, out = run.reconcile(broken)
    assert code == 1, out
    failed = [r.body for r in receiver.delivered("/hook") if r.body["kind"] == "pass_failed"]
    assert [(b["subject"], b["status"]) for b in failed] == [("failed", "firing")]
    assert failed[0]["details"]["errors"]
    code, out = run.reconcile(config)
    assert code == 0, out
    assert [s for k, _, s in kinds(receiver, "/hook") if k == "pass_failed"] == ["firing", "resolved"]
    assert len(receiver.delivered(SLACK_PATH)) == 4

    # An invalid head: the control plane notifies both targets; fixed: resolved.
    write_fleet(repo, [p1, p2], {"127.0.0.2": [("no-such-model", p1)], "127.0.0.3": [("tiny-b", p2)]})
    commit(repo, "an unknown model")
    bad_head = git(repo, "rev-parse", "HEAD")
    assert push_hook(plane)[0] == 200
    body = receiver.wait_for(5, "/hook")[-1].body
    assert (body["kind"], body["subject"], body["status"], body["fingerprint"]) == (
        "invalid_commit", "main", "firing", bad_head)
    assert body["source"]["component"] == "control-plane" and "no-such-model" in json.dumps(body["details"])
    slack = receiver.wait_for(5, SLACK_PATH)[-1]
    assert "[WARNING] Invalid commit: main" in slack.body["text"] and slack.body["blocks"][0]["type"] == "header"
    write_fleet(repo, [p1, p2], {"127.0.0.2": [("tiny-a", p1)], "127.0.0.3": [("tiny-b", p2)]})
    commit(repo, "fixed")
    assert push_hook(plane)[0] == 200
    receiver.wait_for(6, "/hook")
    assert kinds(receiver, "/hook")[-1] == ("invalid_commit", "main", "resolved")
    status, _, exposition = plane.get("/metrics")
    assert status == 200
    assert 'fleetllm_notifications_sent_total{kind="invalid_commit",target="ops"} 2.0' in exposition.decode()

    # rollout_halted through the notifier's emit (what the rollout job calls), with the same settings.
    settings = load_config(config, env)
    store = open_store(settings.state.url, settings.state.base)
    try:
        notifier = make_notifier(settings.notifications, SqlLedger(store.db), component="reconciler",
                                 instance="rollout-test")
        notifier.emit(Event(EventKind.ROLLOUT_HALTED, "roll-42", "rollout roll-42 halted at wave 2: canary Down",
                            details={"rollout": "roll-42", "wave": 2}))
        assert notifier.close(20)
    finally:
        store.close()
    halted = receiver.wait_for(7, "/hook")[-1].body
    assert (halted["kind"], halted["subject"], halted["details"]) == ("rollout_halted", "roll-42",
                                                                       {"rollout": "roll-42", "wave": 2})
    assert "Rollout halted: roll-42" in receiver.wait_for(7, SLACK_PATH)[-1].body["text"]

    # A receiver that holds every answer: a pass whose failure is being sent completes (its exit waits
    # drain_timeout_s at most), and a box fetches its config while a new invalid head is being sent.
    gate.clear()
    answered = len(receiver.received)
    short = tmp / "short-drain.yaml"
    short_doc = yaml.safe_load(broken.read_text())
    short_doc["notifications"]["drain_timeout_s"] = 1
    short.write_text(yaml.safe_dump(short_doc))
    code, out = run.reconcile(short)
    assert code == 1, out
    assert '"reconcile_pass"' in out and "notifications not sent before exit" in out
    write_fleet(repo, [p1, p2], {"127.0.0.2": [("no-such-model", p1)], "127.0.0.3": [("tiny-b", p2)]})
    commit(repo, "unknown again")
    assert push_hook(plane)[0] == 200
    status, _, _ = plane.get("/vllm/config", box_headers("127.0.0.3"))
    assert status == 200
    assert len(receiver.received) == answered  # nothing was answered meanwhile
    gate.set()
    # Once let go, every held request is answered in no set order: the held invalid head, to both
    # targets, and the exited pass's failure where its connection still stands.
    def held_head_answered() -> bool:
        late = list(receiver.received[answered:])
        hook = [r for r in late if r.path == "/hook" and r.status == 200
                and (r.body["kind"], r.body["subject"], r.body["status"]) == ("invalid_commit", "main", "firing")]
        slack = [r for r in late if r.path == SLACK_PATH and r.status == 200 and "Invalid commit: main" in r.body["text"]]
        return len(hook) == 1 and len(slack) == 1

    wait_until("the held invalid head answered on both targets", held_head_answered, 30)

    for output in run.outputs:
        for secret in SECRETS:
            assert secret not in output
        assert receiver.url not in output


def test_serve_check_sends_nothing(tmp_path: Path) -> None:
    """`serve --check` (and the check `serve` runs before it binds) starts the runtime once on the side:
    an invalid head there must not notify (with --check's memory store it would on every run)."""
    p1 = free_port("127.0.0.2")
    repo = tmp_path / "fleet"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_fleet(repo, [p1], {"127.0.0.2": [("tiny-a", p1)]})
    commit(repo, "one box")
    write_fleet(repo, [p1], {"127.0.0.2": [("no-such-model", p1)]})
    commit(repo, "an unknown model")
    with receiving() as receiver:
        document = plane_document(tmp_path / "plane", repo_path=repo, notifications={"targets": [
            {"name": "ops", "kind": "webhook", "url": receiver.url + "/hook", "events": ALL_EVENTS}]})
        config = tmp_path / "control-plane.yaml"
        config.write_text(yaml.safe_dump(document))
        done = subprocess.run([sys.executable, "-m", "fleetllm", "serve", "--check", "--config", str(config)],
                              env={**os.environ, **PLANE_ENV}, cwd=ROOT, capture_output=True, text=True, timeout=120,
                              check=False)
        assert done.returncode == 0, done.stderr
        assert "the branch head" in done.stderr and "is invalid" in done.stderr
        assert receiver.received == []
