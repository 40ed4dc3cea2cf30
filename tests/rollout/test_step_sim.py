"""The rollout step driven over simulated passes (tests/rollout/sim.py): budgets, make-before-break,
drains and halts, asserted from what the simulated LiteLLM routed after every pass."""

from __future__ import annotations

from fleetllm.core.rollout.model import BoxState, RolloutState
from tests.rollout.sim import Sim


def twelve_boxes() -> dict[str, list[tuple[str, int]]]:
    """12 boxes, 12 models, 3 replicas of each model on 3 different boxes, 3 servers a box."""
    layout: dict[str, list[tuple[str, int]]] = {f"box{b:02d}": [] for b in range(12)}
    for m in range(12):
        for r in range(3):
            box = f"box{(m + 4 * r) % 12:02d}"
            layout[box].append((f"model{m:02d}", 8001 + r))
    assert all(len(rows) == 3 for rows in layout.values())
    return layout


def out_per_model(sim: Sim) -> int:
    return max((n for per_pass in sim.unreachable for n in per_pass.values()), default=0)


def test_a_fleet_wide_recipe_change_never_takes_more_than_max_unavailable_of_a_model_out() -> None:
    layout = twelve_boxes()
    models = {m for rows in layout.values() for m, _ in rows}
    sim = Sim.start("r1", layout, dict.fromkeys(models, "v1"))
    sim.run(3)
    sim.commit("r2", layout, dict.fromkeys(models, "v2"))  # every recipe changes: every server restarts
    passes = sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED, sim.steps[-1].status
    assert out_per_model(sim) == 1  # at most max_unavailable (1) of a model out after any pass
    assert max(max(s.out.values(), key=len, default=()) for s in sim.steps[3:]) and all(
        len(keys) <= 1 for s in sim.steps for keys in s.out.values())  # the step's own records agree
    assert sim.failed_requests == []  # LiteLLM never routed to a server that was not up
    assert all(s.revision == "r2" for s in sim.releases.values())
    assert sim.rollout.waves >= 3 and passes < 100


def test_a_larger_budget_takes_fewer_waves() -> None:
    layout = twelve_boxes()
    models = {m for rows in layout.values() for m, _ in rows}
    waves = {}
    for budget in (1, 2):
        sim = Sim.start("r1", layout, dict.fromkeys(models, "v1"), budgets=dict.fromkeys(models, budget))
        sim.run(2)
        sim.commit("r2", layout, dict.fromkeys(models, "v2"))
        sim.run()
        assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED
        assert out_per_model(sim) <= budget and sim.failed_requests == []
        waves[budget] = sim.rollout.waves
    assert waves[2] < waves[1]


def test_one_recipe_change_restarts_only_its_model_one_box_at_a_time() -> None:
    layout = twelve_boxes()
    recipes = {m: "v1" for rows in layout.values() for m, _ in rows}
    sim = Sim.start("r1", layout, recipes)
    sim.run(2)
    sim.commit("r2", layout, {**recipes, "model03": "v2"})
    sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED
    assert sim.failed_requests == [] and out_per_model(sim) == 1
    assert sim.rollout.waves == 3  # its three replicas, one after another
    touched = {b for s in sim.steps for b in s.drain}
    assert touched == {f"fleetllm:box{(3 + 4 * r) % 12:02d}:{8001 + r}" for r in range(3)}


def test_move_to_an_empty_port_is_make_before_break() -> None:
    before = {"a": [("m1", 8001), ("m2", 8002)], "b": [("m1", 8001), ("m3", 8002)], "c": [("m3", 8001)]}
    after = {"a": [("m2", 8002)], "b": [("m1", 8001), ("m3", 8002)], "c": [("m3", 8001), ("m1", 8002)]}
    recipes = {"m1": "v1", "m2": "v1", "m3": "v1"}
    sim = Sim.start("r1", before, recipes)
    sim.run(2)
    sim.commit("r2", after, recipes)
    first = sim.one_pass()
    assert first.released["c"] == "r2" and first.drain == frozenset()  # the gaining box first, at once
    assert "a" not in first.released and first.status["c"].state is BoxState.RELEASED
    assert "make-before-break" in first.status["a"].why
    sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED
    assert sim.failed_requests == []
    assert min(per_pass["m1"] for per_pass in sim.routed_per_model) >= 2  # never fewer than two m1 routed
    drained = [i for i, s in enumerate(sim.steps) if "fleetllm:a:8001" in s.drain]
    routed_new = [i for i, r in enumerate(sim.routed_per_model) if r.get("m1", 0) == 3]
    assert drained and routed_new and routed_new[0] < drained[0]


def test_single_replica_move_keeps_the_model_routed_throughout() -> None:
    before = {"a": [("solo", 8001)], "b": [("other", 8001)]}
    after = {"a": [], "b": [("other", 8001), ("solo", 8002)]}
    recipes = {"solo": "v1", "other": "v1"}
    sim = Sim.start("r1", before, recipes, load_passes=3)
    sim.run(2)
    sim.commit("r2", after, recipes)
    sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED
    assert sim.failed_requests == []
    assert all(per_pass.get("solo", 0) >= 1 for per_pass in sim.routed_per_model)  # never unrouted
    assert sim.releases["a"].revision == "r2" and sim.boxes["a"].running == {}


def test_a_move_that_restarts_the_gaining_cards_neighbour_drains_it_first() -> None:
    """The gaining box re-divides its card: its neighbour restarts (its boot digest changes)."""
    before = {"a": [("m1", 8001)], "b": [("m2", 8001)], "c": [("m2", 8001), ("m1", 8002)]}
    after = {"a": [], "b": [("m2", 8001), ("m1", 8002)], "c": [("m2", 8001), ("m1", 8002)]}
    sim = Sim.start("r1", before, {"m1": "v1", "m2": "v1"})
    sim.run(2)
    # The neighbour on b restarts at the target (its share of the card changes).
    sim.revisions["r2"] = {}
    sim.commit("r2", after, {"m1": "v1", "m2": "v1"})
    b_neighbour = sim.revisions["r2"]["b"].servers[0]
    from dataclasses import replace

    from fleetllm.core.rollout.model import BoxConfig
    sim.revisions["r2"]["b"] = BoxConfig("r2", (replace(b_neighbour, digest="m2:v1:8001:share-0.45"),
                                                 sim.revisions["r2"]["b"].servers[1]))
    first = sim.one_pass()
    assert first.drain == frozenset({"fleetllm:b:8001"}) and first.status["b"].state is BoxState.DRAINING
    assert "make-before-break" in first.status["a"].why
    sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED
    assert sim.failed_requests == [] and out_per_model(sim) <= 1
    assert all(per_pass.get("m1", 0) >= 1 and per_pass.get("m2", 0) >= 1 for per_pass in sim.routed_per_model)


def test_a_bad_boot_change_halts_after_the_first_box_and_rolls_it_back() -> None:
    layout = {f"box{i}": [("m", 8001), (f"n{i}", 8002)] for i in range(4)}
    recipes = {"m": "v1", **{f"n{i}": "v1" for i in range(4)}}
    sim = Sim.start("r1", layout, recipes, bad_digests=frozenset(f"m:bad:{8001}" for _ in range(1)))
    sim.run(2)
    sim.commit("r2", layout, {**recipes, "m": "bad"})
    sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.HALTED
    halted = [b for b, r in sim.releases.items() if r.state is BoxState.HALTED]
    assert halted == ["box0"] and sim.releases["box0"].revision == "r1"
    assert "crash-loop" in sim.rollout.reason and "box0" in sim.rollout.reason
    assert all(sim.releases[f"box{i}"].revision == "r1" for i in range(1, 4))
    assert all(r.applied == "r1" for r in sim.boxes.values())
    assert sim.failed_requests == []
    for _ in range(5):  # halted: nothing more is released, the halted box serves again
        assert not sim.one_pass().released
    assert sim.boxes["box0"].running["m-8001"].ready_in == 0
    sim.commit("r3", layout, recipes)  # the revert starts a new rollout that converges
    sim.run()
    assert sim.rollout.target == "r3" and sim.rollout.state is RolloutState.CONVERGED
    assert sim.failed_requests == []


def test_a_server_that_never_becomes_healthy_halts_at_its_grace() -> None:
    layout = {"a": [("m", 8001)], "b": [("m", 8001)]}
    sim = Sim.start("r1", layout, {"m": "v1"}, load_passes=10_000)
    sim.run(2)
    sim.commit("r2", layout, {"m": "v2"})
    passes = sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.HALTED
    assert "not Healthy within 300s" in sim.rollout.reason
    # counted in the simulator's passes (each advances its clock by interval_s): the halt comes in the pass
    # that reaches the 300 s grace, or within the few passes the release and the drain take before it
    grace_passes = int(300 / sim.interval_s)
    assert grace_passes <= passes <= grace_passes + 5
    assert sim.releases["b"].revision == "r1" and sim.releases["b"].state is BoxState.WAITING


def test_live_only_changes_are_released_at_once() -> None:
    layout = twelve_boxes()
    recipes = {m: "v1" for rows in layout.values() for m, _ in rows}
    sim = Sim.start("r1", layout, recipes)
    sim.run(2)
    sim.commit("r2", layout, recipes)  # same boot digests: only live fields changed
    first = sim.one_pass()
    assert set(first.released) == set(layout) and not first.drain
    assert first.rollout.state is RolloutState.CONVERGED and first.rollout.waves == 0


def test_pause_holds_drains_and_resume_goes_on_abort_rolls_back() -> None:
    layout = {f"box{i}": [("m", 8001)] for i in range(3)}
    sim = Sim.start("r1", layout, {"m": "v1"})
    sim.run(2)
    sim.commit("r2", layout, {"m": "v2"})
    first = sim.one_pass()
    assert first.drain == frozenset({"fleetllm:box0:8001"})
    sim.control = RolloutState.PAUSED
    paused = sim.one_pass()
    assert paused.rollout.state is RolloutState.PAUSED and not paused.released
    assert sim.releases["box0"].state is BoxState.WAITING  # the drain stopped: routed again
    assert "fleetllm:box0:8001" not in paused.held_out
    for _ in range(3):
        assert not sim.one_pass().released
    sim.control = RolloutState.RUNNING
    sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED
    assert sim.failed_requests == []
    sim.commit("r3", layout, {"m": "v3"})
    for _ in range(3):
        sim.one_pass()
    in_flight = [b for b, r in sim.releases.items() if r.state is BoxState.RELEASED]
    assert in_flight
    sim.control = RolloutState.ABORTED
    aborted = sim.one_pass()
    assert aborted.rollout.state is RolloutState.ABORTED
    assert set(aborted.rollbacks) == set(in_flight) and all(v == "r2" for v in aborted.rollbacks.values())


def test_boxes_without_the_agent_are_not_released_but_count_for_the_budget() -> None:
    layout = {"manual": [("m", 8001)], "a": [("m", 8001)], "b": [("m", 8001)]}
    sim = Sim.start("r1", layout, {"m": "v1"}, unmanaged=frozenset({"manual"}))
    sim.run(2)
    sim.commit("r2", layout, {"m": "v2"})
    sim.run()
    assert "manual" not in sim.releases
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED
    assert sim.failed_requests == []
    for _ in range(3):  # a converged rollout with boxes without the agent: passes go on quietly
        assert not sim.one_pass().changed


def test_a_new_commit_during_a_rollout_starts_a_new_one() -> None:
    layout = {f"box{i}": [("m", 8001)] for i in range(3)}
    sim = Sim.start("r1", layout, {"m": "v1"})
    sim.run(2)
    sim.commit("r2", layout, {"m": "v2"})
    sim.one_pass()
    sim.commit("r3", layout, {"m": "v3"})
    nxt = sim.one_pass()
    assert nxt.rollout.target == "r3" and nxt.rollout.waves <= 1
    sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED
    assert all(r.revision == "r3" for r in sim.releases.values()) and sim.failed_requests == []


def test_a_drain_that_did_not_reach_litellm_holds_the_release() -> None:
    layout = {f"box{i}": [("m", 8001)] for i in range(3)}
    sim = Sim.start("r1", layout, {"m": "v1"})
    sim.run(2)
    sim.commit("r2", layout, {"m": "v2"})
    first = sim.one_pass()
    assert first.drain == frozenset({"fleetllm:box0:8001"})
    for _ in range(3):  # LiteLLM still lists it (the delete failed): the box is not released
        sim.routed.add("fleetllm:box0:8001")
        held = sim.one_pass()
        assert "box0" not in held.released and "leave LiteLLM" in held.status["box0"].why
    sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED


def test_a_box_with_more_replicas_of_a_model_than_the_budget_goes_alone() -> None:
    layout = {"twin": [("m", 8001), ("m", 8002)], "a": [("m", 8001)], "b": [("m", 8001)]}
    sim = Sim.start("r1", layout, {"m": "v1"})
    sim.run(2)
    sim.commit("r2", layout, {"m": "v2"})
    sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED
    assert sim.failed_requests == [] and out_per_model(sim) == 2
    twin = [i for i, s in enumerate(sim.steps) if any(d.startswith("fleetllm:twin:") for d in s.drain)]
    alone = sim.steps[twin[0]]
    assert alone.drain == frozenset({"fleetllm:twin:8001", "fleetllm:twin:8002"})  # nothing else out with it


def test_a_box_new_to_the_placement_is_released_at_once() -> None:
    from fleetllm.core.rollout.model import BoxInput, ReportFacts, StepInput
    from fleetllm.core.rollout.step import step
    from tests.rollout.sim import config

    target = config("r2", "fresh", [("m", 8001)], {"m": "v1"})
    inp = StepInput("r2", 100.0, {"fresh": BoxInput("fresh", True, target, None, None, ReportFacts("r1"), new=True)},
                    {}, None, {}, frozenset())
    result = step(inp)
    assert result.released == {"fresh": "r2"} and not result.drain
    stuck = step(StepInput("r2", 100.0, {"fresh": BoxInput("fresh", True, target, None, None, ReportFacts("r1"))},
                           {}, None, {}, frozenset()))
    assert not stuck.released and "cannot be read" in stuck.status["fresh"].why  # unreadable: it waits


def test_a_box_that_takes_the_agent_after_the_rollout_converged_is_still_released() -> None:
    layout = {"a": [("m", 8001)], "late": [("m", 8001)]}
    sim = Sim.start("r1", layout, {"m": "v1"}, unmanaged=frozenset({"late"}))
    sim.run(2)
    sim.commit("r2", layout, {"m": "v2"})
    sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED
    late = sim.boxes["late"]
    late.managed = True  # its installer now runs the agent; it still runs r1
    sim.run()
    assert sim.rollout.state is RolloutState.CONVERGED and sim.releases["late"].revision == "r2"
    assert late.applied == "r2" and sim.failed_requests == []


def test_two_boxes_swapping_models_break_the_cycle_once_and_say_so() -> None:
    before = {"a": [("m1", 8001)], "b": [("m2", 8001)], "c": [("m1", 8001)], "d": [("m2", 8001)]}
    after = {"a": [("m2", 8001)], "b": [("m1", 8001)], "c": [("m1", 8001)], "d": [("m2", 8001)]}
    sim = Sim.start("r1", before, {"m1": "v1", "m2": "v1"})
    sim.run(2)
    sim.commit("r2", after, {"m1": "v1", "m2": "v1"})
    first = sim.one_pass()
    # a stops m1 and waits for b's new m1; b stops m2 and waits for a's new m2: the first one goes.
    assert first.drain == frozenset({"fleetllm:a:8001"}) and first.status["a"].state is BoxState.DRAINING
    assert first.status["a"].why == ("make-before-break is impossible (boxes wait for each other's new servers): "
                                     "released first, its models are short until their new servers serve")
    assert first.status["b"].why == "make-before-break: waits until m2's new server(s) a:8001 are Healthy and routed"
    sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED
    assert sim.failed_requests == []
    assert all(r.get("m1", 0) >= 1 and r.get("m2", 0) >= 1 for r in sim.routed_per_model)  # c and d serve
    breaks = [b for s in sim.steps for b, st in s.status.items() if "impossible" in st.why]
    assert breaks == ["a"]  # once: then b's wait ends by itself


def test_the_halt_reasons_name_the_box_and_what_failed() -> None:
    layout = {"a": [("m", 8001)], "b": [("m", 8001)]}
    crash = Sim.start("r1", layout, {"m": "v1"}, bad_digests=frozenset({"m:v2:8001"}))
    crash.run(2)
    crash.commit("r2", layout, {"m": "v2"})
    crash.run()
    assert crash.rollout is not None
    assert crash.rollout.reason == "box a: server(s) m-8001 crash-loop (the box reports them failed); rolled back to r1"
    halt = next(s.halt for s in crash.steps if s.halt is not None)
    assert (halt.box, halt.rolled_back_to) == ("a", "r1")
    assert crash.releases["a"].reason == crash.rollout.reason
    # The box agent's `failed` report of a crash after it reported installed (issue 27) names the crash too.
    agent = Sim.start("r1", layout, {"m": "v1"}, bad_digests=frozenset({"m:v2:8001"}), late_verdict=True)
    agent.run(2)
    agent.commit("r2", layout, {"m": "v2"})
    agent.run()
    assert agent.rollout is not None and agent.rollout.reason == crash.rollout.reason
    late = Sim.start("r1", layout, {"m": "v1"}, load_passes=10_000)
    late.run(2)
    late.commit("r2", layout, {"m": "v2"})
    late.run()
    assert late.rollout is not None
    assert late.rollout.reason == "box a: server(s) m-8001 (Loading) not Healthy within 300s of the release; rolled back to r1"
    assert late.steps[-1].status["b"].why == "rollout halted"


def test_a_restarted_server_is_routed_again_only_once_it_serves_after_its_box_reported() -> None:
    """The box agent reports once supervisord runs the new programs, before vLLM has loaded; a restarted
    server the judge still calls Healthy by hysteresis is passed to the step as Down by the job (its probe
    failed this pass). Found by the demo's move-model under load through the real LiteLLM: the reconciler
    routed the gaining card's re-divided neighbours again while they loaded, and a request failed."""
    from dataclasses import replace

    from fleetllm.core.rollout.step import step

    sim = Sim.start("r1", {"a": [("m", 8001)], "b": [("m", 8001)]}, {"m": "v1"})
    sim.run(2)
    sim.commit("r2", {"a": [("m", 8001)], "b": [("m", 8001)]}, {"m": "v2"})
    for _ in range(20):
        sim.one_pass()
        applied = [box for box, r in sim.releases.items()
                   if r.state is BoxState.RELEASED and sim.boxes[box].applied == "r2"]
        if applied:
            break
    else:
        raise AssertionError("no box applied its release")
    box = applied[0]
    inp = sim.step_input()
    key, deployment = (box, 8001), f"fleetllm:{box}:8001"
    assert deployment in step(replace(inp, verdicts={**inp.verdicts, key: "Down"})).held_out
    assert deployment not in step(replace(inp, verdicts={**inp.verdicts, key: "Healthy"})).held_out


def test_a_box_over_the_budget_says_why_it_went_alone_while_it_is_out() -> None:
    """2 of m's 3 servers on one box, max_unavailable 1, a recipe change: the box goes alone (nothing else
    of m is out with it) and its status says why, from its drain until its servers serve again."""
    layout = {"a": [("m", 8001)], "twin": [("m", 8001), ("m", 8002), ("x", 8003)]}
    sim = Sim.start("r1", layout, {"m": "v1", "x": "v1"})
    sim.run(2)
    sim.commit("r2", layout, {"m": "v2", "x": "v2"})
    note = ("went alone past the budget: 2 servers of m out at once, over its max_unavailable 1 (a box is the "
            "smallest unit of release: it was released only when no other server of m was out)")
    first = sim.one_pass()
    assert first.drain == frozenset({"fleetllm:a:8001"})  # a first (sorted): twin waits for it
    assert first.status["twin"].why == ("waits for the disruption budget of m: 1 of its servers out (a:8001), "
                                        "max_unavailable 1")
    whys: list[str] = []
    for _ in range(40):
        result = sim.one_pass()
        if result.status["twin"].state in (BoxState.DRAINING, BoxState.RELEASED):
            whys.append(result.status["twin"].why)
            assert set(result.out.get("m", ())) <= {("twin", 8001), ("twin", 8002)}  # alone: a's serves
        if sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED:
            break
    assert whys[0] == f"draining: released in 10s; {note}"
    assert f"released: waits for its changed servers to be Healthy and routed; {note}" in whys
    assert all(why.endswith(note) for why in whys)
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED and sim.failed_requests == []
    assert sim.releases["twin"].reason == "" and sim.steps[-1].status["a"].why == ""


def test_the_status_names_every_model_a_box_takes_past_its_budget() -> None:
    layout = {"a": [("m", 8001)], "b": [("n", 8001)],
              "big": [("m", 8001), ("m", 8002), ("n", 8003), ("n", 8004), ("n", 8005)]}
    sim = Sim.start("r1", layout, {"m": "v1", "n": "v1"}, budgets={"n": 2}, drain_s=0)
    sim.run(2)
    sim.commit("r2", layout, {"m": "v2", "n": "v2"})
    whys = [s.status["big"].why for s in (sim.one_pass() for _ in range(40)) if s.status["big"].state
            is BoxState.RELEASED]
    assert whys and whys[0] == (
        "went alone past the budget: 2 servers of m out at once, over its max_unavailable 1; 3 servers of n out "
        "at once, over its max_unavailable 2 (a box is the smallest unit of release: it was released only when "
        "no other server of m or n was out)")


def test_the_last_server_of_a_model_stays_until_its_new_one_on_a_box_without_the_agent_serves() -> None:
    """m moves from a (its only server) to a box without the agent, where a person starts it. a waits for it:
    that is no cycle between boxes to break, and breaking it would leave m with no server."""
    before = {"a": [("m", 8001)], "manual": [("x", 8001)], "c": [("x", 8001)]}
    after = {"a": [], "manual": [("x", 8001), ("m", 8002)], "c": [("x", 8001)]}
    sim = Sim.start("r1", before, {"m": "v1", "x": "v1"}, unmanaged=frozenset({"manual"}))
    sim.run(2)
    sim.commit("r2", after, {"m": "v1", "x": "v1"})
    for _ in range(10):
        result = sim.one_pass()
        assert "a" not in result.released and not result.drain
        assert result.status["a"].why == ("make-before-break: waits until m's new server(s) manual:8002 are "
                                          "Healthy and routed")
    assert all(r.get("m", 0) == 1 for r in sim.routed_per_model)
    from tests.rollout.sim import Running  # a person starts it on the box
    manual = sim.boxes["manual"]
    spec = next(s for s in sim.config_at("manual", "r2").servers if s.model == "m")  # type: ignore[union-attr]
    manual.running[spec.name] = Running(spec, 1)
    sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED
    assert sim.failed_requests == [] and all(r.get("m", 0) >= 1 for r in sim.routed_per_model)


def test_a_box_holding_every_server_of_a_model_waits_for_a_replica_the_change_adds_elsewhere() -> None:
    """Both of m's servers on one box, a recipe change that restarts them and adds a third on another box:
    the new one serves first, so m is never left with no server; without it, m has none while they load."""
    before = {"all": [("m", 8001), ("m", 8002)], "b": [("x", 8001)]}
    after = {"all": [("m", 8001), ("m", 8002)], "b": [("x", 8001), ("m", 8002)]}
    sim = Sim.start("r1", before, {"m": "v1", "x": "v1"})
    sim.run(2)
    sim.commit("r2", after, {"m": "v2", "x": "v1"})
    first = sim.one_pass()
    assert first.released == {"b": "r2"} and not first.drain
    assert first.status["all"].why == "make-before-break: waits until m's new server(s) b:8002 are Healthy and routed"
    sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED and sim.failed_requests == []
    assert all(r.get("m", 0) >= 1 for r in sim.routed_per_model)
    alone = Sim.start("r1", before, {"m": "v1", "x": "v1"})
    alone.run(2)
    alone.commit("r2", before, {"m": "v2", "x": "v1"})
    drained = alone.one_pass()
    assert drained.drain == frozenset({"fleetllm:all:8001", "fleetllm:all:8002"})
    assert drained.status["all"].why == (
        "draining: released in 10s; went alone past the budget: 2 servers of m out at once, over its "
        "max_unavailable 1 (a box is the smallest unit of release: it was released only when no other server "
        "of m was out)")
    alone.run()
    assert alone.rollout is not None and alone.rollout.state is RolloutState.CONVERGED
    assert alone.failed_requests == [] and min(r.get("m", 0) for r in alone.routed_per_model) == 0


def test_the_went_alone_note_counts_only_what_the_box_takes_out_per_model_budget() -> None:
    """twin restarts its two m servers; its two x servers stay; n's budget is 2 and twin restarts 2 of them:
    only m is past its budget, while the box drains and once released."""
    from fleetllm.core.rollout.model import ReleaseStatus

    layout = {"a": [("m", 8001)], "b": [("n", 8001)],
              "twin": [("m", 8001), ("m", 8002), ("x", 8003), ("x", 8004), ("n", 8005), ("n", 8006)]}
    sim = Sim.start("r1", layout, {"m": "v1", "n": "v1", "x": "v1"}, budgets={"n": 2})
    sim.run(2)
    sim.commit("r2", layout, {"m": "v2", "n": "v2", "x": "v1"})
    note = ("went alone past the budget: 2 servers of m out at once, over its max_unavailable 1 (a box is the "
            "smallest unit of release: it was released only when no other server of m was out)")
    seen = set()
    for _ in range(40):
        applied = sim.boxes["twin"].applied  # what the box reported before the pass
        result = sim.one_pass()
        status = result.status["twin"]
        if status.state in (BoxState.DRAINING, BoxState.RELEASED):
            seen.add(status.state)
            assert status.why.endswith(note) and status.why.count("went alone") == 1, status.why
            released = "r2" if status.state is BoxState.RELEASED else "r1"
            assert status == ReleaseStatus("twin", status.state, released, applied, status.why)
    assert seen == {BoxState.DRAINING, BoxState.RELEASED}
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED and sim.failed_requests == []


def test_a_replica_added_on_a_box_without_the_agent_is_awaited_even_when_the_model_stays() -> None:
    """a restarts m's only server; the change adds one on a box without the agent: a waits for it (a
    person starts it) and m is never without a server."""
    before = {"a": [("m", 8001)], "manual": [("x", 8001)]}
    after = {"a": [("m", 8001)], "manual": [("x", 8001), ("m", 8002)]}
    sim = Sim.start("r1", before, {"m": "v1", "x": "v1"}, unmanaged=frozenset({"manual"}))
    sim.run(2)
    sim.commit("r2", after, {"m": "v2", "x": "v1"})
    for _ in range(6):
        result = sim.one_pass()
        assert not result.drain and result.status["a"].why.startswith("make-before-break: waits until m's new")
    from tests.rollout.sim import Running

    spec = next(s for s in sim.config_at("manual", "r2").servers if s.model == "m")  # type: ignore[union-attr]
    sim.boxes["manual"].running[spec.name] = Running(spec, 0)
    sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED
    assert all(r.get("m", 0) >= 1 for r in sim.routed_per_model) and sim.failed_requests == []


def test_a_box_that_drops_a_server_waits_for_a_manual_box_to_restart_the_model_s_changed_one() -> None:
    """m loses its server on a; its other one, on a box without the agent, changes: a waits until a person
    restarts it (it serves, Stale, meanwhile), rather than breaking a cycle that is none."""
    before = {"a": [("m", 8001)], "manual": [("m", 8001)]}
    after = {"a": [], "manual": [("m", 8001)]}
    sim = Sim.start("r1", before, {"m": "v1"}, unmanaged=frozenset({"manual"}))
    sim.run(2)
    sim.commit("r2", after, {"m": "v2"})
    for _ in range(6):
        result = sim.one_pass()
        assert not result.drain
        assert result.status["a"].why == ("make-before-break: waits until m's new server(s) manual:8001 are "
                                          "Healthy and routed")
    from tests.rollout.sim import Running

    spec = sim.config_at("manual", "r2").servers[0]  # type: ignore[union-attr]
    sim.boxes["manual"].running[spec.name] = Running(spec, 1)
    sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED and sim.failed_requests == []


def test_a_real_cycle_is_broken_beside_a_box_that_waits_for_a_manual_box() -> None:
    """a0 waits for a server a person starts (no cycle); b and c swap models (a cycle), and b also stops a
    model the target drops: the cycle is still broken once."""
    before = {"a0": [("m0", 8001)], "b": [("m1", 8001), ("gone", 8002)], "c": [("m2", 8001)],
              "d": [("m1", 8001)], "e": [("m2", 8001)], "manual": [("x", 8001)]}
    after = {"a0": [], "b": [("m2", 8001)], "c": [("m1", 8001)], "d": [("m1", 8001)], "e": [("m2", 8001)],
             "manual": [("x", 8001), ("m0", 8002)]}
    recipes = {"m0": "v1", "m1": "v1", "m2": "v1", "gone": "v1", "x": "v1"}
    sim = Sim.start("r1", before, recipes, unmanaged=frozenset({"manual"}))
    sim.run(2)
    sim.commit("r2", after, recipes)
    first = sim.one_pass()
    assert first.drain == frozenset({"fleetllm:b:8001", "fleetllm:b:8002"})
    assert first.status["b"].why.startswith("make-before-break is impossible")
    sim.run(30)
    assert sim.releases["c"].revision == "r2" and sim.releases["a0"].revision == "r1"
    assert sim.steps[-1].status["a0"].why == ("make-before-break: waits until m0's new server(s) manual:8002 are "
                                              "Healthy and routed")
    assert [b for s in sim.steps for b, st in s.status.items() if "impossible" in st.why] == ["b"]


# -- without LiteLLM: the boxes route (their gateway, a balancer in front of them) ----------------------------


def test_without_litellm_a_move_is_make_before_break_and_converges() -> None:
    before = {"a": [("m1", 8001), ("m2", 8002)], "b": [("m1", 8001), ("m3", 8002)], "c": [("m3", 8001)]}
    after = {"a": [("m2", 8002)], "b": [("m1", 8001), ("m3", 8002)], "c": [("m3", 8001), ("m1", 8002)]}
    recipes = {"m1": "v1", "m2": "v1", "m3": "v1"}
    sim = Sim.start("r1", before, recipes, boxes_route=True, drain_s=0)
    sim.run(2)
    sim.commit("r2", after, recipes)
    first = sim.one_pass()
    assert first.released["c"] == "r2" and "a" not in first.released  # the gaining box first (b: nothing changes)
    assert "make-before-break" in first.status["a"].why
    sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED
    assert min(per_pass["m1"] for per_pass in sim.routed_per_model) >= 2  # never fewer than two m1 serving
    assert sim.boxes["a"].applied == sim.boxes["c"].applied == "r2"
    assert sorted(sim.boxes["c"].running) == ["m1-8002", "m3-8001"] and sorted(sim.boxes["a"].running) == ["m2-8002"]


def test_without_litellm_a_drain_waits_for_the_requests_in_flight() -> None:
    before = {"a": [("m1", 8001)], "b": [("m1", 8001)]}
    recipes = {"m1": "v1"}
    sim = Sim.start("r1", before, recipes, boxes_route=True, drain_s=100)
    sim.run(2)
    sim.in_flight = {("a", 8001): 3, ("b", 8001): 2}
    sim.commit("r2", before, {"m1": "v2"})
    first = sim.one_pass()
    draining = [b for b, s in first.status.items() if s.state is BoxState.DRAINING]
    assert draining == ["a"] and first.drain == frozenset()
    second = sim.one_pass()
    assert second.status["a"].state is BoxState.DRAINING
    assert "waits for the requests in flight on a:8001 (3 in flight), at most 90s more" in second.status["a"].why
    sim.in_flight[("a", 8001)] = 0  # the last request finished
    third = sim.one_pass()
    assert third.released == {"a": "r2"}
    sim.in_flight = {}  # counts that cannot be read: the drain waits its whole drain_s
    sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED
    b_drained = [i for i, s in enumerate(sim.steps) if s.status.get("b") and s.status["b"].state is BoxState.DRAINING]
    assert len(b_drained) == 10  # drain_s 100 at a pass every 10 s: nothing reported, so the whole drain_s
    assert "count unknown" in sim.steps[b_drained[1]].status["b"].why


def test_without_litellm_requests_that_never_finish_hold_the_drain_at_most_drain_s() -> None:
    before = {"a": [("m1", 8001)], "b": [("m1", 8001)]}
    sim = Sim.start("r1", before, {"m1": "v1"}, boxes_route=True, drain_s=30)
    sim.run(2)
    sim.in_flight = {("a", 8001): 5, ("b", 8001): 5}
    sim.commit("r2", before, {"m1": "v2"})
    sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED


def test_without_litellm_a_bad_boot_halts_and_rolls_back() -> None:
    before = {"a": [("m1", 8001)], "b": [("m1", 8001)], "c": [("m1", 8001)]}
    sim = Sim.start("r1", before, {"m1": "v1"}, boxes_route=True, drain_s=0, bad_digests=frozenset({"m1:bogus:8001"}))
    sim.run(2)
    sim.commit("r2", before, {"m1": "bogus"})
    sim.run()
    assert sim.rollout is not None and sim.rollout.state is RolloutState.HALTED
    halted = [b for b, r in sim.releases.items() if r.state is BoxState.HALTED]
    assert len(halted) == 1 and sim.releases[halted[0]].revision == "r1"
    assert all(r.revision == "r1" for r in sim.releases.values())  # the others never got the bad config
