"""The move-model scenario, as an operator would do it: commit a change that moves a model, read
`llmfleet diff`, see the control plane serve the commit, restart the two boxes (each re-fetches its
config: the installer runs again), and watch the verdicts move and the LiteLLM deployments follow."""

from __future__ import annotations

import subprocess
import sys

from llmfleet.core.fleet.diagnostics import format_text
from llmfleet.core.fleet.files import FLEET_FILES, PLACEMENT_FILE, Snapshot
from llmfleet.core.fleet.validate import validate_snapshot
from llmfleet.demo.check import arrived
from llmfleet.demo.fleet import DemoError
from llmfleet.demo.move import Move, choose_move, move_row
from llmfleet.demo.stage import Stage
from llmfleet.demo.workspace import commit_file


def move_model(demo: Stage) -> Move:
    workspace, plane, passes = demo.workspace, demo.control_plane, demo.passes
    assert workspace is not None
    assert plane is not None
    assert passes is not None
    assert passes.fleet is not None
    move = choose_move(passes.fleet)
    demo.say(f"\nScenario move-model: move {move}", "bold")
    placement = (workspace.fleet / PLACEMENT_FILE).read_text(encoding="utf-8")
    edited = move_row(placement, move)
    files = {name: (workspace.fleet / name).read_bytes() for name in FLEET_FILES}
    check = validate_snapshot(Snapshot("edit", {**files, PLACEMENT_FILE: edited.encode()},
                                       {name: name for name in FLEET_FILES}))
    if check.fleet is None:
        raise DemoError("the moved placement is not valid:\n" + format_text(check.diagnostics))
    head = commit_file(workspace, PLACEMENT_FILE, edited,
                       f"Move {move.model} from {move.source}:{move.source_port} to {move.target}:{move.target_port}")
    demo.say(f"committed {head[:12]} on main of {workspace.fleet}; what it will do:")
    argv = [sys.executable, "-m", "llmfleet", "diff", "HEAD~1", "HEAD", "--repo", str(workspace.fleet)]
    diff = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    demo.say("$ llmfleet diff HEAD~1 HEAD\n" + (diff.stdout + diff.stderr).rstrip(), "dim")
    plane.wait_for(head)
    demo.say(f"the control plane serves {head[:12]}; the boxes still run the old placement until they re-fetch")
    demo.tick()
    # As the runbook says: the box that gains the server first, and the other only once the new server
    # serves (with LiteLLM: has its deployment), so the model is served throughout.
    demo.provision(demo.boxes[move.target], f"restarts to start {move.name} (re-fetches its config)")
    demo.wait(f"waiting for {move.name} to serve on {move.target} before {move.source} stops it",
              lambda outcome: arrived(outcome, move, applying=demo.applying))
    demo.provision(demo.boxes[move.source], f"restarts to stop {move.name} (re-fetches its config)")
    return move
