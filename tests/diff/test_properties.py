"""Properties of the diff, checked against independent oracles: the real box JSON rendered with a
test salt (what boxes fetch), and the deployments a reconciler would derive from it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetllm.core.diff import diff_fleets, render_json, render_markdown, render_text
from fleetllm.core.diff.report import DeploymentAction, Level
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.jsonvalue import JSON, canonical_json
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.fleet.render import Bearers, render_box
from tests.conftest import TEST_LEGACY_KEY, TEST_SALT
from tests.diff.fleets import fleet_pairs, fleets

BEARERS = Bearers(Salt(TEST_SALT), TEST_LEGACY_KEY)


def rendered_servers(fleet: Fleet) -> dict[tuple[str, str], dict[str, JSON]]:
    """(box, process name) -> its entry in the box JSON, bearer included."""
    found = {}
    for box in fleet.boxes:
        servers = render_box(fleet, box, BEARERS)["servers"]
        assert isinstance(servers, list)
        for entry in servers:
            assert isinstance(entry, dict) and isinstance(entry["name"], str)
            found[(box, entry["name"])] = entry
    return found


def deployments(fleet: Fleet) -> dict[tuple[str, int], str]:
    """(box, port) -> everything LiteLLM is told about it, the real bearer included."""
    found = {}
    for (box, _), entry in rendered_servers(fleet).items():
        port = entry["port"]
        assert isinstance(port, int)
        row = next(r for r in fleet.boxes[box].servers if r.port == port)
        litellm = fleet.recipes[row.model].litellm
        found[(box, port)] = canonical_json({"model_name": row.model, "served": entry["served_model_name"],
                                             "params": litellm.params, "info": litellm.model_info,
                                             "api_key": entry["api_key"]})
    return found


@settings(max_examples=150, deadline=None)
@given(fleets("A"))
def test_a_fleet_against_itself_is_empty(fleet: Fleet) -> None:
    report = diff_fleets(fleet, fleet)
    assert not report.changed
    assert (report.servers, report.deployments, report.alerts, report.boxes) == ((), (), (), ())
    assert "No changes: nothing to do." in render_text(report)


@settings(max_examples=200, deadline=None)
@given(fleet_pairs())
def test_lists_exactly_the_servers_whose_box_json_differs(pair: tuple[Fleet, Fleet]) -> None:
    a, b = pair
    before, after = rendered_servers(a), rendered_servers(b)
    differs = {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}
    assert diff_fleets(a, b).touched_servers() == differs


@settings(max_examples=200, deadline=None)
@given(st.one_of(fleet_pairs(), st.tuples(fleets("A"), fleets("B"))))
def test_deployments_bearers_and_outages(pair: tuple[Fleet, Fleet]) -> None:
    a, b = pair
    report = diff_fleets(a, b)
    old, new = deployments(a), deployments(b)
    assert {(d.box, d.port) for d in report.deployments} == {
        key for key in old.keys() | new.keys() if old.get(key) != new.get(key)}
    for d in report.deployments:
        assert (d.action is DeploymentAction.CREATE) == ((d.box, d.port) not in old)
        assert (d.action is DeploymentAction.DELETE) == ((d.box, d.port) not in new)
    # A kept server is reported with a new bearer exactly when the bearer it is rendered with changes.
    before, after = rendered_servers(a), rendered_servers(b)
    for change in report.servers:
        if change.before and change.after:
            was = before[(change.before.box, change.before.name)]["api_key"]
            now = after[(change.after.box, change.after.name)]["api_key"]
            assert (change.bearer is not None) == (was != now)
    served = {row.model for box in a.boxes.values() for row in box.servers}
    still = {row.model for box in b.boxes.values() for row in box.servers}
    assert {x.subject for x in report.alerts if x.level is Level.OUTAGE} == served - still


@settings(max_examples=60, deadline=None)
@given(fleet_pairs(), st.sampled_from(["text", "markdown", "json"]))
def test_renderings_never_contain_a_bearer(pair: tuple[Fleet, Fleet], fmt: str) -> None:
    a, b = pair
    report = diff_fleets(a, b)
    output = {"text": render_text, "markdown": render_markdown, "json": render_json}[fmt](report)
    assert "sk-" not in output
