"""The rollout scenarios, as an engineer lives them: open a pull request, merge, watch. Each commits one
change to the demo's fleet repository and from then on the demo only runs reconcile passes: the box
agents fetch what the control plane releases to them, the reconciler drains and routes. Nobody restarts
a box.

- move-model:  a server moves to a free listen port of another box;
- move-single: the only server of a model moves (make-before-break keeps the model served);
- bad-boot:    a recipe gains `dtype: bogus`, which vLLM refuses at start: the rollout halts after the
               first box, which is rolled back to its last good revision; then a revert commit converges;
- rollouts:    the three in sequence on one demo;
- retire-box:  a box leaves placement.yaml: drained, served a box JSON with no servers, its agent removes every
               program and reports, retired (issue 25); then a recipe change converges, the attention list clear;
- empty-box:   the same after a move that empties a box (its only server moves to another box).
- rent-box:    one commit declares a capacity pool of one box in fleet.yaml and places that box by its label; the
               reconciler rents it from the simulated RunPod (rentals.py), which boots it (runpod.sh, the
               installer) under its label: approved by that commit, it never waits on the attention list, and
               serves through LiteLLM; then one commit takes it out of the placement with its pool's count 0:
               drained, retired, and terminated by the reconciler (issue 25).

With LiteLLM a load generator sends chat completions to every model through the proxy for the whole of
each scenario; the scenario prints per model requests and failures, the seconds from commit to
converged (or halted and rolled back) and the waves the rollout took. For each commit a CI job waits for
its rollout (`fleetllm rollout wait COMMIT`, demo/ciwait.py): it must exit 0 for a change that converges
and 1 for one that halts. With `--forge-api-url` each rollout also sets its commit's status there.
Without LiteLLM the demo keeps its routing table in memory (no proxy: nothing to send load through) and
the rollouts run the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetllm.core.capacity import pool_label
from fleetllm.core.fleet.files import FLEET_FILES, MODELS_FILE
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.rollout.model import BoxState, RolloutState
from fleetllm.core.rollout.retire import RetireState
from fleetllm.core.secret import Secret
from fleetllm.demo import procs
from fleetllm.demo.fleet import DemoError
from fleetllm.demo.litellm import Litellm
from fleetllm.demo.load import LoadGenerator
from fleetllm.demo.move import Move
from fleetllm.demo.rentals import GPU, PRICE, Rentals
from fleetllm.demo.rollouts import (
    POOL,
    Change,
    Played,
    bad_boot_change,
    capacity_change,
    empty_box_change,
    move_change,
    play,
    recipe_change,
    release_change,
    retire_box_change,
    single_move_change,
)
from fleetllm.demo.stage import Stage
from fleetllm.demo.view import PROGRAM_PREFIX
from fleetllm.job.runner import PassRunner

ROLLOUTS = ("move-model", "move-single", "bad-boot")  # what `rollouts` plays, in this order
SCENARIOS = (*ROLLOUTS, "rollouts", "retire-box", "empty-box", "rent-box")
RATE_PER_MODEL = 2.0  # chat completions per second per model, the floor


@dataclass
class Results:
    played: list[Played] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    move: Move | None = None  # the last server moved (the final checks look at it)


def _files(demo: Stage) -> dict[str, str]:
    assert demo.workspace is not None
    return {name: (demo.workspace.fleet / name).read_text(encoding="utf-8") for name in FLEET_FILES}


def _probe(demo: Stage) -> tuple[str | None, int | None]:
    """The rollout of main's head: why it halted (None: it did not), and its waves so far."""
    runner, store = demo.runner, demo.store
    assert runner is not None
    if store is None or runner.fleet is None:
        return None, None
    rollout, _, _ = store.current_rollout()
    if rollout is None or rollout.target != runner.fleet.revision:
        return None, None
    return (rollout.reason or "halted") if rollout.state is RolloutState.HALTED else None, rollout.waves


def _load(demo: Stage, litellm: Litellm | None, unloaded: frozenset[str] = frozenset()) -> LoadGenerator | None:
    """Callers of every model but `unloaded` (models a change leaves with no server for a while, as
    `fleetllm diff` warns: their callers fail whatever the rollout does)."""
    if litellm is None or demo.runner is None or demo.runner.fleet is None:
        return None
    models = {row.model for box in demo.runner.fleet.boxes.values() for row in box.servers} - unloaded
    return LoadGenerator(litellm.url, Secret(litellm.master_key, "the demo's LiteLLM master key"), models,
                         rate_per_model=RATE_PER_MODEL)


def alone_on(fleet: Fleet, box: str) -> frozenset[str]:
    """The models whose only server runs on `box` (a server moved there divides its card afresh: they restart)."""
    counts: dict[str, int] = {}
    for other in fleet.boxes.values():
        for row in other.servers:
            counts[row.model] = counts.get(row.model, 0) + 1
    return frozenset(r.model for r in fleet.boxes[box].servers if counts[r.model] == 1)


def retired_missing(demo: Stage, box: str) -> list[str]:
    """What is still missing before the removed box is retired (issue 25): its retirement recorded, its
    release forgotten, no program left under its supervisord, and no unknown box on the attention list."""
    store = demo.store
    assert store is not None
    missing = []
    record = store.retirements().get(box)
    if record is None or record.state is not RetireState.RETIRED:
        missing.append(f"{box} is {record.state if record else 'not noted as leaving'}, not retired")
    if store.box_release(box) is not None:
        missing.append(f"the rollout still holds a release of {box}")
    programs = demo.boxes[box].states() if box in demo.boxes else {}
    if programs is None or programs:
        missing.append(f"{box}'s supervisord runs {', '.join(sorted(programs)) if programs else 'unknown programs'}")
    unknown = unknown_boxes(demo)
    if unknown:
        missing.append(f"the attention list has unknown boxes: {', '.join(unknown)}")
    return missing


def unknown_boxes(demo: Stage) -> list[str]:
    """The attention list's unknown boxes as the status pages show them: sightings of boxes neither in the
    placement nor leaving it (a rented box's sighting before it was approved is not one once it is placed)."""
    store, runner = demo.store, demo.runner
    assert store is not None
    assert runner is not None
    placed = runner.fleet.boxes if runner.fleet is not None else {}
    leaving = store.retirements()
    return [e.box for e in store.attention() if e.box not in placed and e.box not in leaving]


def rented_missing(demo: Stage, rentals: Rentals, label: str) -> list[str]:
    """What is still missing before the pool's box serves (beyond the rollout's convergence: its servers Healthy
    and routed): a pod labelled `label` rented, its simulated box booted, every program of it RUNNING under its
    supervisord, the attention list clear, and with LiteLLM a caller's chat completion answered by it (the stub
    vLLM's access log)."""
    rented = rentals.by_label(label)
    if rented is None:
        return [f"no pod labelled {label} rented yet"]
    if rented.boot is not None or rented.booted is None:
        return [f"pod {rented.pod} still boots"]
    assert demo.runner is not None
    placed = demo.runner.fleet.boxes.get(rented.name) if demo.runner.fleet is not None else None
    if placed is None:
        return [f"{rented.name} is not in the placement"]
    states = demo.boxes[rented.name].states() if rented.name in demo.boxes else None
    missing = [f"{rented.name}: {row.name} is {(states or {}).get(PROGRAM_PREFIX + row.name, 'not a program')}"
               for row in placed.servers if (states or {}).get(PROGRAM_PREFIX + row.name) != "RUNNING"]
    unknown = unknown_boxes(demo)
    if unknown:
        missing.append(f"the attention list has unknown boxes: {', '.join(unknown)}")
    if demo.applying and not missing:  # with LiteLLM, callers reach it: its server answered a chat completion
        box = demo.boxes[rented.name]
        logs = [box.data / "fleetllm" / "logs" / f"{row.name}.log" for row in placed.servers]
        if not any('"POST /v1/chat/completions" 200' in procs.tail(log, 400) for log in logs):
            missing.append(f"no chat completion through LiteLLM reached {rented.name} yet")
    return missing


def never_waited(demo: Stage, rentals: Rentals, label: str) -> list[str]:
    """The problem, if any, of a rented box that had to wait for an approval: the control plane noted it as
    an unknown box (under its label or its pod id) at some fetch."""
    rented = rentals.by_label(label)
    assert demo.store is not None
    names = {rented.name, rented.pod} if rented is not None else {label}
    seen = sorted(e.box for e in demo.store.attention() if e.box in names)
    return [f"rent-box: the rented box was an unknown box ({', '.join(seen)}): the commit that declared its pool "
            "did not approve it"] if seen else []


def terminated_missing(demo: Stage, rentals: Rentals, label: str) -> list[str]:
    """What is still missing before the released box is gone: retired (retired_missing), terminated at the
    provider, and its simulated box stopped."""
    rented = rentals.by_label(label)
    assert rented is not None
    missing = retired_missing(demo, rented.name)
    if any(p["id"] == rented.pod for p in rentals.pods()):
        missing.append(f"the provider still lists pod {rented.pod}")
    if rented.pod not in rentals.terminated:
        missing.append(f"the box of pod {rented.pod} still runs")
    return missing


def _play(demo: Stage, results: Results, change: Change, message: str, litellm: Litellm | None, *,
          timeout_s: float, interval_s: float, until: Callable[[], list[str]] | None = None,
          unloaded: frozenset[str] = frozenset(), after_commit: Callable[[str], None] | None = None) -> Played:
    if unloaded and litellm is not None:
        demo.say(f"no load for {', '.join(sorted(unloaded))}: the change restarts its only server (the card it "
                 "shares is divided afresh), as fleetllm diff warns", "yellow")
    played = play(demo, change, message, load=_load(demo, litellm, unloaded), rollout=lambda: _probe(demo),
                  timeout_s=timeout_s, interval_s=interval_s, until=until, after_commit=after_commit)
    for line in played.lines():
        demo.say(line, "bold" if not line.startswith(" ") else "")
    results.played.append(played)
    if played.load is not None:
        results.problems += [f"{change.title}: {tally.failed} of {tally.sent} requests to {model} failed"
                             for model, tally in sorted(played.load.tallies.items()) if tally.failed]
    results.problems += _rollout_problems(demo, played)
    if played.ci_problem is not None:
        results.problems.append(played.ci_problem)
    return played


def _rollout_problems(demo: Stage, played: Played) -> list[str]:
    """What is wrong with the rollout's end state: a change converged (every agent box applied it), or a
    halting change halted after exactly one box, rolled back to its last good revision, the others kept."""
    runner, store = demo.runner, demo.store
    assert runner is not None
    assert store is not None
    rollout, _, _ = store.current_rollout()
    title = played.change.title
    if rollout is None or rollout.target != played.commit:
        return [f"{title}: no rollout of {played.commit[:12]}"]
    releases = store.box_releases()
    reports = store.latest_reports()
    if not played.change.halts:
        if rollout.state is not RolloutState.CONVERGED:
            return [f"{title}: the rollout is {rollout.state}, not converged ({rollout.reason})"]
        return []
    found: list[str] = []
    if rollout.state is not RolloutState.HALTED:
        found.append(f"{title}: the rollout is {rollout.state}, not halted")
    halted = sorted(box for box, r in releases.items() if r.state is BoxState.HALTED)
    if len(halted) != 1:
        found.append(f"{title}: {len(halted)} boxes halted ({', '.join(halted)}), not one")
    for box in halted:
        release = releases[box]
        applied = reports[box].revision if box in reports else None
        demo.say(f"  {box} halted and rolled back: released {release.revision[:12]}, last good "
                 f"{release.last_good[:12]}, it reports {applied[:12] if applied else 'nothing'}")
        if release.revision != release.last_good or applied != release.last_good:
            found.append(f"{title}: {box} is not back on its last good revision {release.last_good[:12]}")
    # A box the bad commit does not change may take it (nothing restarts there); one it changes must not.
    on_bad = sorted(box for box, r in releases.items() if r.revision == played.commit
                    and _changes_servers(runner, box, r.last_good, played.commit))
    if on_bad:
        found.append(f"{title}: {', '.join(on_bad)} released {played.commit[:12]}, which changes their servers")
    return found


def _changes_servers(runner: PassRunner, box: str, before: str, after: str) -> bool:
    """Whether commit `after` changes a server of `box` (its rows or their recipes) from `before`."""
    old, new = runner.fleet_at(before), runner.fleet_at(after)
    if old is None or new is None:
        return True
    if (box in old.boxes) != (box in new.boxes):
        return True
    if box not in new.boxes:
        return False

    def servers(fleet: Fleet) -> list[tuple[object, ...]]:
        return [(row, fleet.recipes[row.model]) for row in fleet.boxes[box].servers]

    return servers(old) != servers(new)


def rent_box(demo: Stage, results: Results, litellm: Litellm | None, rentals: Rentals | None,
             timing: dict[str, Any]) -> None:
    """The rent-box scenario: one commit declares a pool and places its box by label; see the box rented, booted,
    approved by that commit (never an unknown box) and serving; then one commit releases it: see it drained,
    retired and terminated."""
    if rentals is None:
        raise DemoError("rent-box needs the simulated RunPod, which the demo starts for that scenario only")
    runner = demo.runner
    assert runner is not None
    assert runner.fleet is not None
    change = capacity_change(runner.fleet, _files(demo), gpu=GPU, max_per_hour=round(PRICE + 0.31, 2))
    label = pool_label(POOL, 1)
    _play(demo, results, change, f"Declare capacity: pool {POOL}, its box {label} placed", litellm,
          until=functools.partial(rented_missing, demo, rentals, label), **timing)
    results.problems += never_waited(demo, rentals, label)
    _play(demo, results, release_change(_files(demo), label), f"Release box {label}: pool {POOL} count 0", litellm,
          until=functools.partial(terminated_missing, demo, rentals, label), **timing)


def run_scenarios(demo: Stage, name: str, litellm: Litellm | None, *, timeout_s: float,
                  interval_s: float, rentals: Rentals | None = None) -> Results:
    """Play scenario `name` (or all of them for `rollouts`) on the running demo; `rentals`: the simulated
    provider of rent-box."""
    if name not in SCENARIOS:
        raise DemoError(f"no scenario {name!r}: pick one of {', '.join(SCENARIOS)}")
    runner = demo.runner
    assert runner is not None
    names = ROLLOUTS if name == "rollouts" else (name,)
    results = Results()
    if litellm is None:
        demo.say("no LiteLLM: no load is sent (a load generator needs a proxy to send through); the routing "
                 "table is kept in the demo's memory so that the rollouts run as they would", "yellow")
    timing: dict[str, Any] = {"timeout_s": timeout_s, "interval_s": interval_s}
    for scenario in names:
        fleet, files = runner.fleet, _files(demo)
        assert fleet is not None
        demo.say(f"\nScenario {scenario}", "bold")
        if scenario == "move-model":
            change, results.move = move_change(fleet, files)
            _play(demo, results, change, f"Move {results.move}", litellm, **timing)
        elif scenario in ("retire-box", "empty-box"):
            alone: frozenset[str] = frozenset()
            if scenario == "retire-box":
                change, box = retire_box_change(fleet, files)
            else:
                change, box, results.move = empty_box_change(fleet, files)
                alone = alone_on(fleet, results.move.target)
            until = functools.partial(retired_missing, demo, box)
            _play(demo, results, change, f"Remove box {box}", litellm, until=until, unloaded=alone, **timing)
            fleet, files = runner.fleet, _files(demo)
            assert fleet is not None
            _play(demo, results, recipe_change(fleet, files), "Change a recipe after the box left", litellm,
                  until=until, **timing)
        elif scenario == "rent-box":
            rent_box(demo, results, litellm, rentals, timing)
        elif scenario == "move-single":
            change, results.move = single_move_change(fleet, files)
            _play(demo, results, change, f"Move the only server of {results.move.model}", litellm, **timing)
        else:
            change = bad_boot_change(fleet, files)
            _play(demo, results, change, f"Change a recipe: {change.title}", litellm, **timing)
            revert = Change(f"revert: {change.title}", {MODELS_FILE: files[MODELS_FILE]})
            _play(demo, results, revert, "Revert the bad boot change", litellm, **timing)
    demo.say("\nRollouts, commit to converged:", "bold")
    for played in results.played:
        waves = f"{played.waves} waves" if played.waves is not None else "waves unknown"
        failed = (f"{played.load.failed} failed of {sum(t.sent for t in played.load.tallies.values())} requests"
                  if played.load is not None else "no load")
        ci = f", CI wait exit {played.ci.code}" if played.ci is not None else ""
        demo.say(f"  {played.change.title}: {'halted' if played.halted else 'converged'} in {played.seconds:.1f} s, "
                 f"{waves}, {failed}{ci}")
    return results
