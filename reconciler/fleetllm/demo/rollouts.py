"""The rollout scenarios: commit a change and watch the fleet converge by itself (each box's agent
re-fetches what the control plane releases to it, the reconciler drains and routes), while callers send
chat completions through LiteLLM to every model. Each scenario reports the time from commit to
converged, the waves the rollout took and every failed request, per model.

The edits are pure (text in, text out, as a person would write them in a pull request); `play` runs one.

- move-model:   a server moves to a free listen port of another box (the existing move, choose_move);
- move-single:  the only server of a model moves (make-before-break: the model must never be unserved);
- bad-boot:     a recipe gains an argument vLLM refuses at start (`dtype: bogus`); the rollout halts after
                the first box, which goes back to its last good revision; then the revert converges.
- retire-box:   a box leaves placement.yaml: its deployments leave LiteLLM, it is served a box JSON with no
                servers and its agent removes every program and reports, it is retired (issue 25); then a
                recipe change converges and the attention list stays clear;
- empty-box:    the same, the box emptied by moving its only server to another box.
- rent-box:     one commit declares a capacity pool of one box in fleet.yaml and places that box by its label
                (capacity_change): rented, it is approved by that commit; then one commit takes it out of the
                placement with its pool's count 0 (release_change).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fleetllm.core.capacity import pool_label
from fleetllm.core.fleet import strictyaml
from fleetllm.core.fleet.approve import ApproveError, add_box, assign_rows
from fleetllm.core.fleet.files import FLEET_FILE, MODELS_FILE, PLACEMENT_FILE
from fleetllm.core.fleet.model import Fleet, Provider
from fleetllm.core.rollout.model import RolloutState
from fleetllm.demo import procs
from fleetllm.demo.check import waiting_for
from fleetllm.demo.ciwait import CiWait, Waited
from fleetllm.demo.fleet import DEFAULT_GPU_MEMORY_GB, DemoError
from fleetllm.demo.load import LoadGenerator, LoadReport
from fleetllm.demo.move import CEILING, Move, choose_move, move_row, remove_box
from fleetllm.demo.stage import Stage
from fleetllm.demo.workspace import commit_files
from fleetllm.job.engine import PassOutcome

BAD_SETTING = ("dtype", "bogus")  # vLLM 0.32 exits 2 at start: "argument --dtype: invalid choice: 'bogus'"


@dataclass(frozen=True)
class Change:
    """One commit of a scenario: the files it rewrites and what the fleet should end in."""

    title: str
    files: Mapping[str, str]
    halts: bool = False  # the rollout is expected to halt (and roll the first box back)


@dataclass(frozen=True)
class Played:
    change: Change
    commit: str
    seconds: float  # commit to converged (or to halted and rolled back)
    passes: int
    waves: int | None
    halted: str | None  # why the rollout halted, when it did
    load: LoadReport | None
    notes: tuple[str, ...] = field(default=())
    ci: Waited | None = None  # `fleetllm rollout wait COMMIT`, the CI job after the merge

    @property
    def ci_problem(self) -> str | None:
        """What is wrong with the CI job's outcome: 1 for a halting change, 0 for one that converges."""
        expected = 1 if self.change.halts else 0
        if self.ci is None or self.ci.code == expected:
            return None
        return (f"{self.change.title}: `fleetllm rollout wait {self.commit[:12]}` "
                + ("did not end" if self.ci.code is None else f"exited {self.ci.code}") + f", not {expected}")

    def lines(self) -> list[str]:
        waves = f", {self.waves} waves" if self.waves is not None else ""
        out = [f"{self.change.title}: {'halted' if self.halted else 'converged'} {self.seconds:.1f} s after commit "
               f"{self.commit[:12]}, {self.passes} passes{waves}"]
        if self.halted:
            out.append(f"  halted: {self.halted}")
        if self.ci is not None:
            out.append(self.ci.line(self.commit))
        if self.load is not None:
            out.append(f"  callers: {self.load.rate_per_model:g} requests/s per model for "
                       f"{self.load.duration_s:.0f} s, {self.load.failed} failed")
            out.extend("  " + line for line in self.load.lines())
        return out


# -- the edits (pure) ------------------------------------------------------------------------------
def move_change(fleet: Fleet, files: Mapping[str, str]) -> tuple[Change, Move]:
    move = choose_move(fleet)
    return Change(f"move {move}", {PLACEMENT_FILE: move_row(files[PLACEMENT_FILE], move)}), move


def choose_single_move(fleet: Fleet) -> Move:
    """The only server of a model, to a free listen port of another box with room for it."""
    counts: dict[str, int] = {}
    for box in fleet.boxes.values():
        for row in box.servers:
            counts[row.model] = counts.get(row.model, 0) + 1
    for source in fleet.boxes.values():
        for row in source.servers:
            if (counts[row.model] != 1 or source.gateway_port is not None
                    or fleet.settings.is_legacy(source.name, row.port)):
                continue
            move = _move_to_room(fleet, source.name, row.model, row.name, row.port, {})
            if move is not None:
                return move
    raise DemoError("move-single found no model with one server that another box has room for")


def _move_to_room(fleet: Fleet, source: str, model: str, name: str, port: int,
                  added: Mapping[str, list[Move]]) -> Move | None:
    """A move of the server to a free listen port of another box with room for it, besides the servers
    `added` there by earlier moves (None: no box has room)."""
    for target in fleet.boxes.values():
        if target.name == source or target.gateway_port is not None:
            continue
        if any(fleet.settings.is_legacy(target.name, r.port) for r in target.servers):
            continue
        extra = added.get(target.name, [])
        used = {r.port for r in target.servers} | {m.target_port for m in extra}
        names = {r.name for r in target.servers} | {m.name for m in extra}
        free = [p for p in fleet.settings.listen_ports if p not in used]
        if not free or name in names or len(target.servers) + len(extra) >= fleet.settings.max_servers_per_box:
            continue
        if _fits(fleet, target.name, model, [m.model for m in extra]):
            return Move(model, name, source, port, target.name, free[0])
    return None


def _fits(fleet: Fleet, box: str, model: str, added: list[str] | None = None) -> bool:
    target = fleet.boxes[box]
    vram = (sum(fleet.recipes[r.model].vllm.vram_gb or 0 for r in target.servers)
            + sum(fleet.recipes[m].vllm.vram_gb or 0 for m in added or ())
            + (fleet.recipes[model].vllm.vram_gb or 0))
    return vram <= CEILING * (target.gpu_memory_gb or DEFAULT_GPU_MEMORY_GB)


def single_move_change(fleet: Fleet, files: Mapping[str, str]) -> tuple[Change, Move]:
    move = choose_single_move(fleet)
    return Change(f"move the only server of {move.model}: {move}",
                  {PLACEMENT_FILE: move_row(files[PLACEMENT_FILE], move)}), move


def retire_box_change(fleet: Fleet, files: Mapping[str, str]) -> tuple[Change, str]:
    """Remove the box with the most servers whose every model also runs on another box (so no model loses
    its last server)."""
    def elsewhere(box: str, model: str) -> bool:
        return any(model in {r.model for r in other.servers} for name, other in fleet.boxes.items() if name != box)

    boxes = [b for b in fleet.boxes.values() if b.servers and b.gateway_port is None
             and not any(fleet.settings.is_legacy(b.name, r.port) for r in b.servers)
             and all(elsewhere(b.name, r.model) for r in b.servers)]
    if not boxes:
        raise DemoError("retire-box found no box whose every model also runs on another box")
    box = max(boxes, key=lambda b: (len(b.servers), b.name)).name
    return Change(f"remove box {box}", {PLACEMENT_FILE: remove_box(files[PLACEMENT_FILE], box)}), box


def empty_box_change(fleet: Fleet, files: Mapping[str, str]) -> tuple[Change, str, Move]:
    """Move every server of a box to other boxes with room (a box with fewer servers first), which empties
    the box: its key goes too."""
    for source in sorted(fleet.boxes.values(), key=lambda b: (len(b.servers), b.name)):
        if not source.servers or source.gateway_port is not None or \
                any(fleet.settings.is_legacy(source.name, r.port) for r in source.servers):
            continue
        moves: list[Move] = []
        added: dict[str, list[Move]] = {}
        for row in source.servers:
            move = _move_to_room(fleet, source.name, row.model, row.name, row.port, added)
            if move is None:
                break
            moves.append(move)
            added.setdefault(move.target, []).append(move)
        else:
            text = files[PLACEMENT_FILE]
            for move in moves:
                text = move_row(text, move)
            title = f"move {', '.join(str(m) for m in moves)}, emptying {source.name}"
            return Change(title, {PLACEMENT_FILE: remove_box(text, source.name)}), source.name, moves[-1]
    raise DemoError("empty-box found no box whose every server other boxes have room for")


def recipe_change(fleet: Fleet, files: Mapping[str, str]) -> Change:
    """A boot change of the recipe of the model with the most servers, legacy pairs counted (they restart it
    too): the rollout restarts them one at a time, so the model keeps serving."""
    counts: dict[str, int] = {}
    for box in fleet.boxes.values():
        for row in box.servers:
            counts[row.model] = counts.get(row.model, 0) + 1
    if not counts:
        raise DemoError("no model to change")
    model = max(sorted(counts), key=lambda m: counts[m])
    return Change(f"a recipe change: {model} gets `max-num-seqs: 64`",
                  {MODELS_FILE: with_setting(files[MODELS_FILE], model, "max-num-seqs", "64")})


def most_replicated(fleet: Fleet) -> str:
    counts: dict[str, int] = {}
    for box in fleet.boxes.values():
        for row in box.servers:
            if not fleet.settings.is_legacy(box.name, row.port) and box.gateway_port is None:
                counts[row.model] = counts.get(row.model, 0) + 1
    if not counts:
        raise DemoError("no model to change")
    return max(sorted(counts), key=lambda m: counts[m])


def with_setting(models: str, model: str, key: str, value: str) -> str:
    """models.yaml's text with `key: value` added to the recipe's vllm settings (a one-line change)."""
    doc = strictyaml.load(models, MODELS_FILE)
    lines = models.split("\n")
    recipe = ["models", model, "vllm"]
    vllm: object = doc.value
    for step in ("models", model, "vllm"):
        vllm = vllm.get(step) if isinstance(vllm, dict) else None
    if not isinstance(vllm, dict):
        raise DemoError(f"{MODELS_FILE}: no recipe {model} with a vllm mapping")
    if isinstance(vllm.get("settings"), dict) and vllm["settings"]:
        first = doc.mark_at([*recipe, "settings"])  # the first entry of the settings mapping
        indent = " " * (first.column - 1)
        lines.insert(first.line - 1, f"{indent}{key}: {value}")
    else:
        first = doc.mark_at(recipe)
        indent = " " * (first.column - 1)
        lines.insert(first.line - 1, f"{indent}settings: {{{key}: {value}}}")
    return "\n".join(lines)


def bad_boot_change(fleet: Fleet, files: Mapping[str, str]) -> Change:
    model = most_replicated(fleet)
    key, value = BAD_SETTING
    return Change(f"a boot change vLLM refuses: {model} gets `{key}: {value}`",
                  {MODELS_FILE: with_setting(files[MODELS_FILE], model, key, value)}, halts=True)


POOL = "demo"  # the rent-box scenario's capacity pool (its rentals are labelled fleetllm-demo-N)


def capacity_change(fleet: Fleet, files: Mapping[str, str], *, gpu: str, max_per_hour: float) -> Change:
    """One commit that declares pool POOL of one `gpu` box on RunPod at most `max_per_hour` (fleet.yaml's
    `capacity:` appended, the fleet's rented boxes at most twice that) and places its box by its label,
    `fleetllm-demo-1`, with the most replicated model (placement.yaml, as `fleetllm approve LABEL MODEL
    --provider runpod` would write it): the box is rented with its label as its name, so this commit approves it."""
    fleet_yaml = files[FLEET_FILE]
    declared = strictyaml.load(fleet_yaml, FLEET_FILE).value
    if isinstance(declared, dict) and "capacity" in declared:
        raise DemoError(f"{FLEET_FILE} already declares capacity: the rent-box scenario adds its own")
    section = (f"\n# fleetllm demo rent-box: boxes rented from the simulated RunPod (docs/runbooks.md \"Capacity\")\n"
               f"capacity:\n  max_fleet_per_hour: {2 * max_per_hour:g}\n  pools:\n    {POOL}:\n"
               f"      provider: runpod\n      gpu: {gpu}\n      gpus: 1\n      count: 1\n"
               f"      max_per_hour: {max_per_hour:g}\n      template: fleetllm-demo\n")
    label, model = pool_label(POOL, 1), most_replicated(fleet)
    try:
        rows = assign_rows(fleet, label, [model])
    except ApproveError as exc:
        raise DemoError(f"rent-box cannot place {label}: {exc}") from None
    placement = add_box(files[PLACEMENT_FILE], label, rows, f"rented for capacity pool {POOL}", Provider.RUNPOD)
    return Change(f"declare capacity: pool {POOL}, 1 × {gpu} on RunPod at most ${max_per_hour:g}/h, its box "
                  f"{label} placed with {model}",
                  {FLEET_FILE: fleet_yaml.rstrip("\n") + "\n" + section, PLACEMENT_FILE: placement})


def with_count(fleet_yaml: str, count: int) -> str:
    """fleet.yaml with pool POOL's `count` replaced (one line)."""
    doc = strictyaml.load(fleet_yaml, FLEET_FILE)
    pool: object = doc.value
    for step in ("capacity", "pools", POOL):
        pool = pool.get(step) if isinstance(pool, dict) else None
    if not isinstance(pool, dict) or not isinstance(pool.get("count"), int):
        raise DemoError(f"{FLEET_FILE} declares no pool {POOL} with a count")
    mark = doc.mark_at(["capacity", "pools", POOL, "count"])
    lines = fleet_yaml.split("\n")
    line = lines[mark.line - 1]
    start = mark.column - 1
    end = start + len(line[start:]) - len(line[start:].lstrip("0123456789"))
    lines[mark.line - 1] = line[:start] + str(count) + line[end:]
    return "\n".join(lines)


def release_change(files: Mapping[str, str], box: str) -> Change:
    """The rented box leaves, in one commit: out of placement.yaml, and its pool's count 0 in fleet.yaml (it is
    terminated once it has retired)."""
    return Change(f"release the rented box {box}: out of the placement, pool {POOL} count 0",
                  {PLACEMENT_FILE: remove_box(files[PLACEMENT_FILE], box),
                   FLEET_FILE: with_count(files[FLEET_FILE], 0)})


# -- playing one change ----------------------------------------------------------------------------
RolloutProbe = Callable[[], "tuple[str | None, int | None]"]  # (halt reason or None, waves so far or None)


def converged(demo: Stage, outcome: PassOutcome, head: str) -> list[str]:
    """What is still missing before `head` is everywhere: every box of the placement reports it applied
    `head`, the fleet is where it should be (servers Healthy, LiteLLM in step), and the rollout of `head`
    has recorded that it converged (the pass after the last box's report does)."""
    runner, store = demo.runner, demo.store
    assert runner is not None
    assert store is not None
    assert runner.fleet is not None
    reports = store.latest_reports()
    missing = [f"{name} has not applied {head[:12]} (it reports "
               f"{reports[name].revision[:12] if name in reports else 'nothing'})"
               for name in sorted(runner.fleet.boxes) if name in demo.boxes
               and (name not in reports or reports[name].revision != head)]
    rollout, _, _ = store.current_rollout()
    if rollout is not None and rollout.target == head and rollout.state is not RolloutState.CONVERGED:
        missing.append(f"the rollout of {head[:12]} is {rollout.state}")
    return missing + waiting_for(outcome, applying=demo.applying)


def play(demo: Stage, change: Change, message: str, *, load: LoadGenerator | None, rollout: RolloutProbe,
         timeout_s: float, interval_s: float, until: Callable[[], list[str]] | None = None,
         after_commit: Callable[[str], None] | None = None) -> Played:
    """Commit the change, then only passes (no manual step but `after_commit`, given the commit) until it
    converged (and `until` finds nothing missing) or, for a halting change, halted; the load runs from before
    the commit to the end."""
    workspace = demo.workspace
    assert workspace is not None
    if load is not None:
        load.start()
    head = commit_files(workspace, change.files, message)
    started = time.monotonic()
    demo.say(f"committed {head[:12]}: {change.title}; no manual step from here", "bold")
    assert demo.control_plane is not None
    ci = CiWait(workspace, demo.control_plane.url, head, timeout_s)  # the CI job after the merge
    passes, halted, waves = 0, None, None
    try:
        if after_commit is not None:
            after_commit(head)
        while True:
            outcome = demo.tick()
            passes += 1
            halted, waves = rollout()
            if outcome is not None:
                missing = converged(demo, outcome, head) if not change.halts else []
                if not change.halts and not missing and until is not None:
                    missing = until()
                if not change.halts and not missing:
                    break
                if change.halts and halted is not None and not waiting_for(outcome, applying=demo.applying):
                    break
            if time.monotonic() - started > timeout_s:
                state = "halted" if change.halts else "converged"
                raise DemoError(f"{change.title}: not {state} after {timeout_s:g} s")
            procs.pause(interval_s)
    except BaseException:
        ci.stop()
        raise
    finally:
        report = load.stop() if load is not None else None
    seconds = round(time.monotonic() - started, 1)
    return Played(change, head, seconds, passes, waves, halted, report, ci=ci.collect())
