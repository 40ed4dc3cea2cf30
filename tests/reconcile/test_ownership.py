"""Fleet identity in LiteLLM ownership (issue 27): one pure reading of whose a deployment is, the id a
pass owns by, and what the planner does with deployments of another fleet or written before fleet ids."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from fleetllm.adapters.git import read_fleet
from fleetllm.core.fleet.jsonvalue import freeze_mapping
from fleetllm.core.fleet.validate import validate_snapshot
from fleetllm.core.judge.intended import INFO_FLEET, Endpoint, Intended, desired_deployment
from fleetllm.core.judge.observed import Deployment
from fleetllm.core.judge.ownership import (
    Claim,
    FleetIdError,
    Owner,
    derived_fleet_id,
    fleet_identity,
    owner,
)
from fleetllm.core.judge.plan import ActionKind, make_plan
from tests.conftest import EXAMPLE, git

from .builders import assessed, failed, intended, observation, ok, server, up_history

A1, A2 = server("127.0.0.2", 8001, "qwen"), server("127.0.0.2", 8002, "llama")
B1 = server("127.0.0.9", 8001, "qwen")  # another fleet's box
ROOT = "0123456789abcdef0123456789abcdef01234567"


def of_fleet(want: Intended, fleet_id: str | None) -> Intended:
    return dataclasses.replace(want, fleet_id=fleet_id)


def written_by(fleet_id: str | None, s=A1) -> Deployment:  # type: ignore[no-untyped-def]
    """The deployment a fleet with `fleet_id` (None: before fleet ids) wrote for server `s`."""
    spec = desired_deployment(s, Endpoint(s.box, s.port), "a" * 40, fleet_id)
    return Deployment(spec.id, spec.model_name, spec.model_info, spec.api_base)


def test_owner_reads_the_marker_the_fleet_id_and_the_box() -> None:
    ours = Claim("blue", frozenset({"127.0.0.2"}))
    assert owner(written_by("blue"), ours) is Owner.OURS
    assert owner(written_by("green"), ours) is Owner.OTHER_FLEET
    assert owner(written_by(None), ours) is Owner.ADOPTABLE
    assert owner(written_by(None, B1), ours) is Owner.UNCLAIMED
    assert owner(Deployment("x", "m", freeze_mapping({"id": "x"})), ours) is Owner.NOT_FLEETLLM
    # a fleet id that is not a string is nobody's we know: never ours
    odd = dataclasses.replace(written_by(None), model_info=freeze_mapping({**written_by(None).model_info,
                                                                          INFO_FLEET: 7}))
    assert owner(odd, ours) is Owner.OTHER_FLEET


def test_a_declared_id_wins() -> None:
    assert fleet_identity("blue", ROOT, [], frozenset()).fleet_id == "blue"
    assert fleet_identity("blue", ROOT, [], frozenset()).note is None


def test_a_new_fleet_must_name_itself() -> None:
    with pytest.raises(FleetIdError, match=r"fleet.yaml: fleet_id is required for a new fleet.*add `fleet_id: NAME`"):
        fleet_identity(None, ROOT, [written_by("green"), written_by(None, B1)], frozenset({"127.0.0.2"}))


def test_an_existing_fleet_gets_an_id_derived_from_its_first_commit_and_is_told() -> None:
    identity = fleet_identity(None, ROOT, [written_by(None)], frozenset({"127.0.0.2"}))
    assert identity.fleet_id == derived_fleet_id(ROOT) == "git-0123456789ab"
    assert identity.note is not None and "add `fleet_id: git-0123456789ab` to fleet.yaml" in identity.note
    # stable: the same on every pass
    assert fleet_identity(None, ROOT, [written_by(None)], frozenset({"127.0.0.2"})) == identity


def test_an_existing_fleet_outside_git_must_name_itself() -> None:
    with pytest.raises(FleetIdError, match="not read from a git repository"):
        fleet_identity(None, None, [written_by(None)], frozenset({"127.0.0.2"}))


def test_without_the_listing_nothing_is_judged() -> None:
    assert fleet_identity(None, ROOT, None, frozenset()).fleet_id == "git-0123456789ab"
    assert fleet_identity(None, None, None, frozenset()).fleet_id is None


def plan_for(fleet_id: str, servers, probes, deployments, histories=None):  # type: ignore[no-untyped-def]
    want = of_fleet(intended(servers), fleet_id)
    obs = observation(want, probes, deployments)
    return make_plan(want, obs, assessed(want, obs, histories))


def test_a_fleet_never_deletes_or_writes_another_fleets_deployments() -> None:
    """Fleet blue holds A1 only; green's deployments (an orphan to blue's eyes, and one under the very id
    of blue's server) are neither deleted nor updated nor reported as blue's drift."""
    greens = [written_by("green", B1), written_by("green", A2)]
    plan = plan_for("blue", [A1, A2], {A1.key: ok(A1), A2.key: ok(A2)}, [written_by("blue"), *greens])
    assert [(a.kind, a.id) for a in plan.actions] == []
    assert [d.id for d in plan.drift] == [A2.id]  # blue's own server, held under green's id: said, not touched
    assert "belongs to fleet 'green'" in plan.drift[0].reason
    assert "belongs to fleet 'green'" in plan.unrouted[A2.key]


def test_the_pre_fleet_id_deployments_of_its_boxes_are_adopted_in_place() -> None:
    plan = plan_for("blue", [A1], {A1.key: ok(A1)}, [written_by(None), written_by(None, B1)])
    assert [(a.kind, a.id) for a in plan.actions] == [(ActionKind.UPDATE, A1.id)]  # an update, never a replace
    action = plan.actions[0]
    assert action.after is not None and action.after.model_info[INFO_FLEET] == "blue"
    assert action.reason == "adopted into fleet blue in place (written before fleet ids)"
    # a box it does not hold: maybe another fleet's, written before fleet ids: reported, never deleted
    assert [d.id for d in plan.drift] == [B1.id]
    # and once adopted, nothing more
    again = plan_for("blue", [A1], {A1.key: ok(A1)}, [dataclasses.replace(written_by("blue"))])
    assert again.empty


def test_an_adoptable_deployment_of_a_server_that_is_down_is_deleted_as_its_own() -> None:
    history = {A1.key: dataclasses.replace(up_history(), fail_streak=2, recent="11100")}
    plan = plan_for("blue", [A1], {A1.key: failed()}, [written_by(None)], history)
    assert [(a.kind, a.id) for a in plan.actions] == [(ActionKind.DELETE, A1.id)]


def test_the_delete_budget_counts_only_the_fleets_own() -> None:
    """Green's many deployments do not widen blue's delete budget."""
    greens = [written_by("green", server(f"127.0.1.{i}", 8001)) for i in range(20)]
    orphans = [written_by("blue", server("127.0.0.2", port)) for port in (8003, 8004, 8005)]
    plan = plan_for("blue", [A1], {A1.key: ok(A1)}, [written_by("blue"), *orphans, *greens])
    assert plan.count(ActionKind.DELETE) == 0 and plan.blocked  # 3 deletes > max(1, 0.5 * 4 of its own)


def test_once_adopted_into_the_derived_id_the_fleet_stays_existing() -> None:
    """After the adoption nothing is id-less any more: the derived id's own deployments keep it existing."""
    derived = derived_fleet_id(ROOT)
    identity = fleet_identity(None, ROOT, [written_by(derived)], frozenset({"127.0.0.2"}))
    assert identity.fleet_id == derived and identity.note is not None
    with pytest.raises(FleetIdError):  # another fleet's ids do not make it existing
        fleet_identity(None, ROOT, [written_by("git-ffffffffffff")], frozenset({"127.0.0.2"}))


def test_an_existing_fleet_whose_litellm_was_emptied_is_known_by_the_id_its_passes_recorded() -> None:
    """LiteLLM holds nothing of the fleet (a reset proxy, a new database), but the state store records that
    its passes owned by its derived id: existing, not new. A fresh store (a new fleet) is still refused;
    an id recorded by another repository, or a declared id taken out of fleet.yaml, does not count (that
    one is named in the refusal)."""
    derived = derived_fleet_id(ROOT)
    identity = fleet_identity(None, ROOT, [], frozenset({"127.0.0.2"}), recorded=derived)
    assert identity.fleet_id == derived and identity.settled
    assert identity.note is not None and f"add `fleet_id: {derived}`" in identity.note
    assert fleet_identity(None, ROOT, [written_by("green")], frozenset({"127.0.0.2"}), derived).fleet_id == derived
    with pytest.raises(FleetIdError, match="no earlier pass recorded this fleet's derived id"):
        fleet_identity(None, ROOT, [], frozenset({"127.0.0.2"}), recorded=None)
    with pytest.raises(FleetIdError) as caught:
        fleet_identity(None, ROOT, [], frozenset({"127.0.0.2"}), recorded="git-ffffffffffff")
    assert "put `fleet_id: git-ffffffffffff` back" in str(caught.value)
    with pytest.raises(FleetIdError, match="put `fleet_id: blue` back"):
        fleet_identity(None, ROOT, [], frozenset({"127.0.0.2"}), recorded="blue")
    with pytest.raises(FleetIdError, match="fleet_id is required for a new fleet"):
        fleet_identity(None, None, [], frozenset({"127.0.0.2"}), recorded=derived)  # no origin: no derived id
    assert not fleet_identity(None, ROOT, None, frozenset()).settled  # derived unjudged: never recorded


def test_a_fleet_read_from_git_knows_its_first_commit(tmp_path: Path) -> None:
    """What an existing fleet's id is derived from: the root commit, at every revision, from the git objects
    and from a working tree; a directory outside git has none (such a fleet must name itself)."""
    repo = tmp_path / "fleet"
    shutil.copytree(EXAMPLE, repo)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "first")
    root = git(repo, "rev-parse", "HEAD")
    (repo / "fleet.yaml").write_text((repo / "fleet.yaml").read_text() + "\n")
    git(repo, "commit", "-q", "-am", "second")
    assert read_fleet(str(repo), "HEAD").origin == root
    assert read_fleet(str(repo), None).origin == root  # the working tree
    fleet = validate_snapshot(read_fleet(str(repo), "HEAD")).fleet
    assert fleet is not None and fleet.origin == root
    plain = tmp_path / "plain"
    shutil.copytree(EXAMPLE, plain)
    assert read_fleet(str(plain), None).origin is None


def test_only_the_fleets_own_orphans_are_probed() -> None:
    """A probe carries this fleet's bearer: another fleet's deployments are never probed."""
    from fleetllm.job.observer import _orphans

    want = of_fleet(intended([A1]), "blue")
    ours, theirs = written_by("blue", A2), written_by("green", B1)
    assert _orphans(want, (written_by("blue"), ours, theirs)) == [ours]
