"""What a reconcile pass records for the pages (reconciler/fleetllm/job/record.py, reconciler/fleetllm/adapters/state/passes.py),
how the state store keeps it, and which invalid commits the revision tracker remembers."""

from __future__ import annotations

import dataclasses

from fleetllm.adapters.state.passes import ActionRecord, DriftRecord, DuplicateRecord, PassRecord, ServerRecord
from fleetllm.core.fleet.jsonvalue import freeze_mapping
from fleetllm.core.judge.intended import MANAGED_BY
from fleetllm.core.judge.observed import Deployment
from fleetllm.job.record import duplicate_records
from tests.conftest import git
from tests.pages.conftest import World
from tests.pages.scenario import FOREIGN_BOX, HEALTHY_BOX, MANUAL_ID, OTHER_ID, PENDING_BOX, STALLED_BOX, break_branch

SERVER = ServerRecord("b", 8001, "m", "m", "Healthy", "serves m at b:41001", "b:41001", 4096, 4096, True)
DETAILED = PassRecord(100.0, 1.5, "a" * 40, "apply", {"Healthy": 1},
                      (ActionRecord("create", "fleetllm:b:8001", True, "created"),), servers=(SERVER,),
                      drift_details=(DriftRecord("x", "m", "unmanaged", "http://b:41001/v1", "b:8001"),),
                      duplicates=(DuplicateRecord("http://b:41001/v1", "m", ("fleetllm:b:8001", "x")),))


def test_the_real_reconciler_records_every_server_and_the_drift(world: World) -> None:
    port, port2 = world.ports
    record = world.outcomes[-1].record
    assert record == world.runtime.store.recent_passes(1)[0]  # as stored and read back by the pages' store
    by_key = {(s.box, s.port): s for s in record.servers}
    assert {k: s.verdict for k, s in by_key.items()} == {
        (HEALTHY_BOX, port): "Healthy", (HEALTHY_BOX, port2): "Stale", (STALLED_BOX, port): "Stalled",
        (FOREIGN_BOX, port): "Foreign", (PENDING_BOX, port): "Pending"}
    stale = by_key[(HEALTHY_BOX, port2)]
    assert (stale.endpoint, stale.max_model_len, stale.served_max_model_len, stale.deployment) == (
        f"{HEALTHY_BOX}:{port2}", 4096, 2048, True)
    assert by_key[(PENDING_BOX, port)].served_max_model_len is None
    assert by_key[(STALLED_BOX, port)].deployment is False
    assert [(d.id, d.fleet_server) for d in record.drift_details] == [
        (MANUAL_ID, f"{HEALTHY_BOX}:{port}"), (OTHER_ID, None)]
    assert record.duplicates == (DuplicateRecord(f"http://{HEALTHY_BOX}:{port}/v1", "tiny-a",
                                                 (f"fleetllm:{HEALTHY_BOX}:{port}", MANUAL_ID)),)
    first = world.outcomes[0].record
    assert first.duplicates == ()  # the managed deployment did not exist yet when the first pass looked


def test_a_failed_litellm_listing_leaves_deployment_presence_unknown(world: World) -> None:
    from tests.pages.scenario import Stubs, run_passes

    served = world.runtime.tracker.served
    assert served is not None
    world.litellm.list_fails = True
    [outcome] = run_passes(world.state, served.fleet, world.litellm, Stubs(world.ports), world.clock, 1)
    record = outcome.record
    assert not record.ok and record.errors
    assert {s.deployment for s in record.servers} == {None}
    assert record.drift_details == () and record.duplicates == ()


def test_records_round_trip_and_old_records_still_read() -> None:
    assert PassRecord.from_json(DETAILED.to_json()) == DETAILED
    old = {"started_at": 1.0, "duration_s": 0.5, "revision": "b" * 40, "mode": "apply", "verdicts": {"Down": 2},
           "actions": [{"kind": "delete", "id": "fleetllm:b:8001", "ok": False, "outcome": "failed",
                        "error": "HTTP 503"}], "errors": ["vast listing: x"], "blocked": [], "held": 1, "drift": 0}
    record = PassRecord.from_json(old)
    assert record.servers == () and record.drift_details == () and record.duplicates == ()
    assert not record.detailed and not record.ok
    assert record.summary() == record
    assert DETAILED.summary() == dataclasses.replace(DETAILED, servers=(), drift_details=(), duplicates=())


def deployment(ident: str, model: str, base: str | None, *, managed: bool) -> Deployment:
    info = {"id": ident, "managed_by": MANAGED_BY} if managed else {"id": ident}
    return Deployment(ident, model, freeze_mapping(info), base)


def test_duplicates_are_one_model_at_one_address_not_all_ours() -> None:
    ours = deployment("fleetllm:b:8001", "m", "http://b:1/v1", managed=True)
    also_ours = deployment("fleetllm:b:8002", "m", "http://b:1/v1/", managed=True)  # two servers behind a gateway
    by_hand = deployment("hand", "m", "http://b:1/v1", managed=False)
    other_model = deployment("hand-2", "n", "http://b:1/v1", managed=False)
    nowhere = deployment("hand-3", "m", None, managed=False)
    assert duplicate_records((ours, also_ours)) == ()
    assert duplicate_records((ours, other_model, nowhere)) == ()
    assert duplicate_records((ours, also_ours, by_hand, other_model)) == (
        DuplicateRecord("http://b:1/v1", "m", ("fleetllm:b:8001", "fleetllm:b:8002", "hand")),)
    assert duplicate_records(None) == ()


def test_the_tracker_remembers_the_invalid_commits_after_the_served_one(world: World) -> None:
    tracker = world.runtime.tracker
    served = tracker.served
    assert served is not None
    work = world.repo
    second = break_branch(work)  # a second bad commit on top of the first
    tracker.refresh()
    assert [c.revision for c in tracker.skipped] == [second, world.bad_commit]
    assert tracker.served is not None and tracker.served.revision == served.revision
    git(work, "revert", "--no-edit", "HEAD~2..HEAD")  # a fix: valid again
    tracker.refresh()
    assert tracker.skipped == ()
    assert tracker.served.revision == git(work, "rev-parse", "HEAD")
