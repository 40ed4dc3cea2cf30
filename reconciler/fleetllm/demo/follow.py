"""Following commits in the live demo. A box running the box agent (rollout mode auto, the demo's
default) applies a commit by itself when the control plane releases it: the demo never restarts it. A
box without the agent (`rollout: manual`) learns its servers only when it boots, so after a commit an
operator restarts the boxes it touches; the live demo does that for you, so that an edit of the demo's
fleet repository plays out end to end. `changes` (pure) says which boxes a revision touches; `follow`
acts on it.

- a box without the agent whose rendered config (its servers, their recipes and bearers) changed is
  restarted; a box with the agent is left to it;
- a new box whose name is a loopback address gets a simulated box booted for it;
- a box is restarted or booted only once the control plane serves the revision: one booted before would
  fetch the old config (a new box: no config at all) and stay failed;
- a box that left the placement is stopped (the demo destroys the instance; a real one keeps running,
  and billing, until you destroy it).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.jsonvalue import canonical_json
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.fleet.render import Bearers, render_box
from fleetllm.demo import procs
from fleetllm.demo.boxes import SimulatedBox
from fleetllm.demo.fleet import DemoError, binds, sim_box
from fleetllm.demo.stage import Stage


@dataclass(frozen=True)
class Changes:
    restart: tuple[str, ...] = ()
    new: tuple[str, ...] = ()
    gone: tuple[str, ...] = ()
    cannot: tuple[str, ...] = ()  # new boxes the demo cannot simulate (their names are not loopback addresses)

    @property
    def empty(self) -> bool:
        return not (self.restart or self.new or self.gone or self.cannot)


def _config(fleet: Fleet, box: str, bearers: Bearers) -> str:
    document = render_box(fleet, box, bearers)
    document.pop("revision", None)  # a new commit that changes nothing for the box changes nothing here
    return canonical_json(document)


def loopback(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback and name != "127.0.0.1"
    except ValueError:
        return False


def changes(old: Fleet, new: Fleet, bearers: Bearers) -> Changes:
    restart = tuple(b for b in new.boxes if b in old.boxes
                    and _config(old, b, bearers) != _config(new, b, bearers))
    added = [b for b in new.boxes if b not in old.boxes]
    return Changes(restart=restart, new=tuple(b for b in added if loopback(b)),
                   gone=tuple(b for b in old.boxes if b not in new.boxes),
                   cannot=tuple(b for b in added if not loopback(b)))


def follow(demo: Stage, old: Fleet | None) -> Fleet | None:
    """A newly served revision plays out on the boxes it touches. Returns the fleet now followed."""
    assert demo.runner is not None
    assert demo.workspace is not None
    new = demo.runner.fleet
    if old is None or new is None or new.revision == old.revision:
        return new
    legacy = demo.workspace.secret("legacy-api-key")
    found = changes(old, new, Bearers(Salt(demo.workspace.secret("vllm-api-salt")), legacy))
    agents = agent_boxes(demo)
    restart = [name for name in found.restart if name in demo.boxes and name not in agents]
    demo.say(f"commit {new.revision[:12]} is served" + (
        ": it changes no box's servers" if found.empty else
        "; the box agents apply it as the rollout releases it" if not restart else
        "; the rollout releases it to the boxes with an agent, the demo restarts the others it touches"))
    if (restart or found.new) and demo.control_plane is not None:
        try:  # the reconciler read the commit from git; the control plane refreshes on its own
            demo.control_plane.wait_for(new.revision)
        except DemoError as exc:
            demo.say(f"{exc}: the boxes it touches are left as they are", "red")
            return new
    for name in restart:
        demo.provision(demo.boxes[name], "restarts (re-fetches its config; it runs no box agent)")
    for name in found.new:
        add_box(demo, new, name)
    for name in found.gone:
        if name in demo.boxes:
            demo.boxes.pop(name).stop()
            demo.say(f"box {name} left the placement: the demo stops it (destroy a real one at its provider)")
    for name in found.cannot:
        demo.say(f"box {name} is not a loopback address: the demo cannot simulate it, so it stays Pending",
                 "yellow")
    return new


def agent_boxes(demo: Stage) -> set[str]:
    """Boxes whose latest report says the box agent runs there: they apply released revisions themselves."""
    store = demo.store
    if store is None:
        return set()
    return {name for name, report in store.latest_reports().items() if report.agent}


def add_box(demo: Stage, fleet: Fleet, name: str) -> None:
    assert demo.workspace is not None
    busy = [f"{a}:{p}" for a, p in binds(fleet) if a == name and not procs.can_bind(a, p)]
    if busy:
        demo.say(f"box {name}: {', '.join(busy)} taken; the demo cannot simulate it", "yellow")
        return
    box = demo.boxes[name] = SimulatedBox(sim_box(fleet.boxes[name], name), demo.workspace.boxes / name,
                                          demo.workspace.sockets / f"{name}.sock", demo.workspace.tag)
    demo.owned.add(name)
    box.prepare(fleet)
    demo.provision(box, "boots (new in the placement)")
