"""Whole passes with the staged rollout (issue 14): the real engine over the HTTP fakes (LiteLLM's model
API, vLLM stand-ins) and the real state store (SQLite). An agent box is judged and routed by its released
revision, its server is drained on purpose even with a delete budget of zero, its box is released only
after drain_s, and the rollout, its box releases and the pass records survive in the store."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from fleetllm.adapters.litellm import LitellmClient
from fleetllm.adapters.state import StateStore, open_store
from fleetllm.core.boxreport import BoxReport
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.jsonvalue import freeze_mapping
from fleetllm.core.fleet.model import (
    Box,
    Fleet,
    FleetSettings,
    Recipe,
    ReconcileSettings,
    RolloutSettings,
    ServerRow,
    VllmRecipe,
    frozen_map,
)
from fleetllm.core.fleet.render import Bearers, render_box
from fleetllm.core.rollout.model import BoxState, RolloutState
from fleetllm.core.rollout.retire import RetireState
from fleetllm.core.secret import Secret
from fleetllm.job.engine import PassOutcome, Reconciler
from fleetllm.job.observer import Observer
from fleetllm.job.rollout import RolloutDriver
from fleetllm_contract.report import ReportOutcome

from .fakes import FakeLitellmHttp, FakeServer, FakeVllm, serve

SALT = Salt("rollout-salt-0123456789abcdef")
BOX = "127.0.0.1"
R1, R2 = "1" * 40, "2" * 40


def fleet(revision: str, port: int, arg: str) -> Fleet:
    recipes = {"m": Recipe("m", VllmRecipe(model="org/m", served_model_name="m", max_model_len=4096, args=(arg,)))}
    boxes = {BOX: Box(BOX, (ServerRow("m", port, "m"),))}
    settings = FleetSettings(listen_ports=(port,), fleet_id="test-fleet", reconcile=ReconcileSettings(
        probe_timeout_s=2, down_after_failures=1, up_after_successes=1, max_deletes_per_pass=0),
        rollout=RolloutSettings(drain_s=10))
    return Fleet(revision, settings, frozen_map(recipes), frozen_map(boxes))


def report(at: float, revision: str, target: Fleet) -> BoxReport:
    doc = render_box(target, BOX, Bearers(SALT))
    servers = [{"name": s["name"], "digest": s["digest"], "state": "started"}  # type: ignore[index]
               for s in doc["servers"]]  # type: ignore[union-attr]
    return BoxReport(BOX, at, BOX, revision, "test", ReportOutcome.INSTALLED,
                     freeze_mapping({"agent": True, "servers": servers}))


def reconciler_for(store: StateStore, litellm: FakeLitellmHttp, lport: int, fleets: dict[str, Fleet],
                   now: list[float]) -> Reconciler:
    """The real engine with the staged rollout over the LiteLLM fake at `lport`, its clock `now[0]`."""
    return Reconciler(Bearers(SALT), Observer({}, 2, 8),
                      lambda s: LitellmClient(s, f"http://127.0.0.1:{lport}", Secret(litellm.master_key, "test")),
                      store, clock=lambda: now[0], rollout=RolloutDriver(store, fleets.get, Bearers(SALT)))


def said(outcome: PassOutcome) -> list[tuple[str, str]]:
    """The rollout's transitions the pass recorded (what it announces)."""
    assert outcome.record.rollout is not None
    return [(c.target, str(c.transition)) for c in outcome.record.rollout.changes]


def test_a_boot_change_is_drained_on_purpose_then_released_then_routed_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    store = open_store(url)
    litellm = FakeLitellmHttp()
    vllm = FakeVllm()
    now = [1000.0]

    async def scenario() -> None:
        async with serve(litellm.app()) as (lport,), serve(vllm.app(), [0]) as (port,):
            vllm.servers[port] = FakeServer("m", SALT.derive(BOX, port), "org/m")
            fleets = {R1: fleet(R1, port, "--a"), R2: fleet(R2, port, "--b")}
            driver = RolloutDriver(store, fleets.get, Bearers(SALT))
            reconciler = Reconciler(Bearers(SALT), Observer({}, 2, 8),
                                    lambda s: LitellmClient(s, f"http://127.0.0.1:{lport}",
                                                            Secret(litellm.master_key, "test")),
                                    store, clock=lambda: now[0], rollout=driver)
            store.record_report(report(now[0], R1, fleets[R1]), keep=5)
            first = await reconciler.run_pass(fleets[R1], apply=True)
            assert [r.outcome for r in first.results] == ["created"]
            assert first.rollout is not None and first.rollout.rollout.state is RolloutState.CONVERGED
            assert said(first) == [(R1, "started"), (R1, "converged")]  # the first rollout: nothing to move
            deployment = f"fleetllm:{BOX}:{port}"

            # A boot change is merged: the box is still served R1, so its server is judged by R1 (Healthy,
            # not Stale) and drained on purpose, though the delete budget is zero.
            now[0] += 60
            second = await reconciler.run_pass(fleets[R2], apply=True)
            assert second.intended.servers[(BOX, port)].digest == first.intended.servers[(BOX, port)].digest
            assert [(r.action.kind, r.outcome) for r in second.results] == [("delete", "deleted")]
            assert "rollout drain" in second.results[0].action.reason
            assert deployment not in litellm.rows
            assert store.box_releases()[BOX].state is BoxState.DRAINING
            assert store.box_releases()[BOX].revision == R1
            assert said(second) == [(R2, "started")]

            # Before drain_s has passed the box is not released, and nothing recreates the deployment.
            now[0] += 5
            third = await reconciler.run_pass(fleets[R2], apply=True)
            assert third.results == () and store.box_releases()[BOX].state is BoxState.DRAINING
            assert said(third) == []
            now[0] += 6
            fourth = await reconciler.run_pass(fleets[R2], apply=True)
            release = store.box_releases()[BOX]
            assert (release.revision, release.state, release.last_good) == (R2, BoxState.RELEASED, R1)
            assert fourth.record.rollout is not None and fourth.record.rollout.released == {BOX: R2}
            assert fourth.results == ()  # still held out: the box has not applied R2 yet

            # The agent applies R2 and reports: the server is routed again, then the box is applied.
            now[0] += 30
            store.record_report(report(now[0], R2, fleets[R2]), keep=5)
            fifth = await reconciler.run_pass(fleets[R2], apply=True)
            assert [r.outcome for r in fifth.results] == ["created"]
            now[0] += 30
            sixth = await reconciler.run_pass(fleets[R2], apply=True)
            assert sixth.rollout is not None and sixth.rollout.rollout.state is RolloutState.CONVERGED
            assert said(sixth) == [(R2, "converged")] and said(fifth) == []
            # A pass that does not record its step (a dry run, a suspension) says nothing: the next one will.
            assert said(await reconciler.run_pass(fleets[R1], apply=False)) == []
            assert store.box_releases()[BOX] == replace(release, state=BoxState.APPLIED, last_good=R2)

    asyncio.run(scenario())
    store.close()
    again = open_store(url)  # durable: a restarted control plane finds the rollout where it was
    try:
        rollout, _, _ = again.current_rollout()
        assert rollout is not None and rollout.target == R2 and rollout.state is RolloutState.CONVERGED
        newest = again.recent_passes(1)[0].rollout
        assert newest is not None and newest.state == "converged" and newest.boxes == {BOX: "applied"}
    finally:
        again.close()


def test_metrics_show_a_halt_once_and_the_boxes_by_state() -> None:
    from fleetllm.adapters.state.passes import PassRecord, RolloutPassRecord
    from fleetllm.job.metrics import PassMetrics

    metrics = PassMetrics()
    halted = RolloutPassRecord(R2, "halted", "box a: crash loop", 1, boxes={"a": "halted", "b": "waiting",
                                                                             "c": "waiting"}, halt="box a: crash loop")
    metrics.observe(PassRecord(1.0, 0.1, R2, "apply", {}, rollout=halted))
    metrics.observe(PassRecord(2.0, 0.1, R2, "apply", {}, rollout=replace(halted, halt="")))
    value = metrics.registry.get_sample_value
    assert value("fleetllm_rollout_halted") == 1
    assert value("fleetllm_rollout_halts_total") == 1
    assert value("fleetllm_rollout_boxes", {"state": "waiting"}) == 2
    assert value("fleetllm_rollout_boxes", {"state": "halted"}) == 1
    assert value("fleetllm_rollout_boxes", {"state": "applied"}) == 0
    metrics.observe(PassRecord(3.0, 0.1, R1, "apply", {}, rollout=RolloutPassRecord(R1, "running")))
    assert value("fleetllm_rollout_halted") == 0


def test_a_pass_record_with_a_rollout_reads_back() -> None:
    from fleetllm.adapters.state.passes import PassRecord, RolloutPassRecord
    from fleetllm.core.rollout.transitions import RolloutChange, Transition

    record = PassRecord(1.0, 0.1, R2, "apply", {"Healthy": 1}, rollout=RolloutPassRecord(
        R2, "running", waves=2, released={"a": R2}, drained=("fleetllm:b:8001",), boxes={"a": "released"},
        out={"m": ("b:8001",)}, changes=(RolloutChange(R1, Transition.SUPERSEDED, 5.0, "superseded by 2222", 1, R2, 2.0),
                                         RolloutChange(R2, Transition.STARTED, 5.0, started_at=5.0))))
    assert PassRecord.from_json(record.to_json()) == record
    later = record.to_json()  # a record of a later version, naming a transition this one does not know
    later["rollout"]["changes"].append({"target": R2, "transition": "teleported", "at": 6.0})
    assert PassRecord.from_json(later) == record
    assert PassRecord.from_json({k: v for k, v in record.to_json().items() if k != "rollout"}).rollout is None


def test_a_failed_install_halts_the_rollout_and_rolls_the_box_back(tmp_path: Path,
                                                                 caplog) -> None:  # type: ignore[no-untyped-def]
    import logging

    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    litellm = FakeLitellmHttp()
    vllm = FakeVllm()
    now = [1000.0]

    async def scenario() -> None:
        async with serve(litellm.app()) as (lport,), serve(vllm.app(), [0]) as (port,):
            vllm.servers[port] = FakeServer("m", SALT.derive(BOX, port), "org/m")
            fleets = {R1: fleet(R1, port, "--a"), R2: fleet(R2, port, "--b")}
            fleets[R2] = replace(fleets[R2], settings=replace(fleets[R2].settings,
                                                              rollout=RolloutSettings(drain_s=0)))
            reconciler = reconciler_for(store, litellm, lport, fleets, now)
            store.record_report(report(now[0], R1, fleets[R1]), keep=5)
            await reconciler.run_pass(fleets[R1], apply=True)
            now[0] += 60
            released = await reconciler.run_pass(fleets[R2], apply=True)  # drain_s 0: drained and released
            assert released.record.rollout is not None and released.record.rollout.released == {BOX: R2}
            # The agent applies R2 and the install fails.
            now[0] += 30
            failed = replace(report(now[0], R2, fleets[R2]), outcome=ReportOutcome.FAILED)
            store.record_report(failed, keep=5)
            with caplog.at_level(logging.INFO, logger="fleetllm.rollout"):
                halted = await reconciler.run_pass(fleets[R2], apply=True)
            assert halted.rollout is not None and halted.rollout.rollout.state is RolloutState.HALTED
            assert "installing revision 2222222222" in halted.rollout.rollout.reason
            assert halted.record.rollout is not None and halted.record.rollout.halt
            assert halted.record.rollout.rollbacks == {BOX: R1}
            release = store.box_releases()[BOX]
            assert (release.revision, release.state) == (R1, BoxState.HALTED)
            assert said(halted) == [(R2, "halted")]
            assert halted.record.rollout.changes[0].reason == halted.rollout.rollout.reason
            events = [r for r in caplog.records if r.getMessage() == "rollout halted"]
            assert len(events) == 1 and events[0].fields["box"] == BOX  # type: ignore[attr-defined]
            # Halted: the next pass releases nothing, and the box is served R1 again.
            now[0] += 30
            after = await reconciler.run_pass(fleets[R2], apply=True)
            assert after.rollout is not None and not after.rollout.released
            assert after.rollout.rollout.state is RolloutState.HALTED
            assert said(after) == []

    asyncio.run(scenario())
    store.close()


def test_the_cli_reads_released_revisions_from_git_objects(fleet_git: Path, tmp_path: Path) -> None:
    """`fleetllm apply/reconcile` give the rollout every commit's fleet (a box's released revision)."""
    from fleetllm.job.configfile import config_from_env
    from fleetllm.job.runner import PassRunner, RunnerOptions
    from fleetllm.job.wiring import rollout_driver
    from tests.conftest import git

    first = git(fleet_git, "rev-parse", "HEAD")
    (fleet_git / "placement.yaml").write_text((fleet_git / "placement.yaml").read_text() + "\n  203.0.113.99:\n"
                                                                                            "    - [qwen3-8b, 8001]\n")
    git(fleet_git, "commit", "-qam", "a box")
    config = config_from_env({"FLEETLLM_VLLM_API_SALT": "cli-salt-0123456789abcdef", "LITELLM_URL": "http://127.0.0.1:9",
                              "LITELLM_MASTER_KEY": "sk-cli-test"})
    runner = PassRunner(RunnerOptions("apply", repo=str(fleet_git)), config, say=print)
    old = runner.fleet_at(first)
    assert old is not None and old.revision == first and "203.0.113.99" not in old.boxes
    assert runner.fleet_at("f" * 40) is None  # not a commit of this repository: the box waits, nothing breaks
    assert runner.fleet_at(first) is old  # kept: commits do not change
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        assert rollout_driver(store, runner.fleet_at, Bearers(SALT)) is not None
        from fleetllm.adapters.state.reconcile import MemoryStore
        assert rollout_driver(MemoryStore(), runner.fleet_at, Bearers(SALT)) is None  # `memory:`: no rollout
    finally:
        store.close()


def test_an_unreadable_released_revision_keeps_the_heads_servers_not_none(tmp_path: Path) -> None:
    from fleetllm.core.judge.intended import intended_state
    from fleetllm.core.rollout.model import BoxRelease
    from fleetllm.job.rollout import Begun

    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        head = fleet(R2, 8001, "--b")
        release = BoxRelease(BOX, R1, R1, 1.0, BoxState.APPLIED)
        begun = Begun(head, None, None, {BOX: release}, {BOX: report(1.0, R1, fleet(R1, 8001, "--a"))}, {BOX})
        unreadable = RolloutDriver(store, lambda revision: None, Bearers(SALT))
        intended = unreadable.compose(begun, intended_state(head, Bearers(SALT)))
        assert set(intended.servers) == {(BOX, 8001)}  # kept (the head's), never pruned for a read error
        readable = RolloutDriver(store, {R1: fleet(R1, 8001, "--a")}.get, Bearers(SALT))
        at_release = readable.compose(replace(begun, fleets={}), intended_state(head, Bearers(SALT)))
        assert at_release.servers[(BOX, 8001)].digest != intended.servers[(BOX, 8001)].digest  # R1's
        elsewhere = RolloutDriver(store, {R1: replace(fleet(R1, 8001, "--a"), boxes={})}.get, Bearers(SALT))
        assert elsewhere.compose(replace(begun, fleets={}), intended_state(head, Bearers(SALT))).servers == {}
    finally:
        store.close()


def test_a_removed_box_is_drained_retired_and_forgotten_so_the_next_rollout_converges(tmp_path: Path) -> None:
    """Issue 25: the removed box's deployment is deleted on purpose, then it retires (the control plane serves
    it no servers), its empty report retires it and drops its release, and a later commit converges."""
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    litellm = FakeLitellmHttp()
    vllm = FakeVllm()
    now = [1000.0]
    r3 = "3" * 40

    async def scenario() -> None:
        async with serve(litellm.app()) as (lport,), serve(vllm.app(), [0]) as (port,):
            vllm.servers[port] = FakeServer("m", SALT.derive(BOX, port), "org/m")
            placed = fleet(R1, port, "--a")
            fleets = {R1: placed, R2: replace(placed, revision=R2, boxes=frozen_map({})),
                      r3: replace(placed, revision=r3, boxes=frozen_map({}))}
            reconciler = reconciler_for(store, litellm, lport, fleets, now)
            store.record_report(report(now[0], R1, fleets[R1]), keep=5)
            await reconciler.run_pass(fleets[R1], apply=True)

            now[0] += 60  # the box leaves the placement
            drained = await reconciler.run_pass(fleets[R2], apply=True)
            assert [(r.action.kind, r.outcome) for r in drained.results] == [("delete", "deleted")]
            assert "rollout drain" in drained.results[0].action.reason
            assert store.retirements()[BOX].state is RetireState.DRAINING
            now[0] += 11  # drain_s passed: released R2, nothing of its left in LiteLLM: it retires
            await reconciler.run_pass(fleets[R2], apply=True)
            retiring = store.retirements()[BOX]
            assert (retiring.state, retiring.revision, retiring.kept_revision) == (RetireState.RETIRING, R2, R1)
            assert store.box_releases()[BOX].revision == R2

            now[0] += 30  # its agent applied the box JSON with no servers and reported
            store.record_report(BoxReport(BOX, now[0], BOX, R2, "test", ReportOutcome.INSTALLED,
                                          freeze_mapping({"servers": []})), keep=5)
            done = await reconciler.run_pass(fleets[R2], apply=True)
            assert store.retirements()[BOX].state is RetireState.RETIRED
            assert BOX not in store.box_releases()
            assert done.rollout is not None and done.rollout.rollout.state is RolloutState.CONVERGED

            now[0] += 60  # a later commit: its rollout does not wait for the removed box
            later = await reconciler.run_pass(fleets[r3], apply=True)
            assert later.rollout is not None and later.rollout.rollout.state is RolloutState.CONVERGED
            assert store.box_releases() == {} and store.retirements()[BOX].state is RetireState.RETIRED

    asyncio.run(scenario())
    store.close()
