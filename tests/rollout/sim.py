"""A simulated fleet driven by the real rollout step, pass by pass.

Each pass: observe the world (verdicts, reports, LiteLLM's deployments), run `step`, delete the drained
deployments, converge LiteLLM to the released configs (a deployment for every serving server that is
not held out), then every agent box applies the config it is served (restarting the servers whose boot
digest changed). After each pass the simulator records which deployments LiteLLM routes to a server
that is not up (a request would fail) and, per model, how many of its servers callers cannot reach.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetllm.core.rollout.model import (
    BoxConfig,
    BoxInput,
    BoxRelease,
    ReportFacts,
    Rollout,
    RolloutState,
    ServerSpec,
    Step,
    StepInput,
)
from fleetllm.core.rollout.step import step

Layout = Mapping[str, list[tuple[str, int]]]  # box -> [(model, port)]


def config(revision: str, box: str, rows: list[tuple[str, int]], recipes: Mapping[str, str],
           grace_s: int = 300) -> BoxConfig:
    servers = tuple(ServerSpec(name=f"{model}-{port}", model=model, port=port,
                               digest=f"{model}:{recipes.get(model, 'v1')}:{port}",
                               deployment=f"fleetllm:{box}:{port}", grace_s=grace_s)
                    for model, port in rows)
    return BoxConfig(revision, servers)


@dataclass
class Running:
    """A server process on a box."""

    spec: ServerSpec
    ready_in: int  # passes until it answers; -1: never (a bad config)


@dataclass
class SimBox:
    name: str
    managed: bool = True
    running: dict[str, Running] = field(default_factory=dict)
    applied: str = ""
    reported_at: float = 0.0
    failed: frozenset[str] = frozenset()


@dataclass
class Sim:
    revisions: dict[str, dict[str, BoxConfig]]  # revision -> box -> config
    target: str
    boxes: dict[str, SimBox]
    load_passes: int = 2
    bad_digests: frozenset[str] = frozenset()
    late_verdict: bool = False  # a crash is reported as the box agent's later `failed` report (outcome failed)
    budgets: Mapping[str, int] = field(default_factory=dict)
    interval_s: float = 10.0
    drain_s: int = 10
    now: float = 1000.0
    rollout: Rollout | None = None
    releases: dict[str, BoxRelease] = field(default_factory=dict)
    routed: set[str] = field(default_factory=set)
    steps: list[Step] = field(default_factory=list)
    failed_requests: list[tuple[int, str]] = field(default_factory=list)  # (pass, deployment)
    unreachable: list[dict[str, int]] = field(default_factory=list)  # per pass: model -> servers out
    out_on: list[dict[str, set[str]]] = field(default_factory=list)  # per pass: model -> boxes with one out
    routed_per_model: list[dict[str, int]] = field(default_factory=list)
    control: RolloutState | None = None
    ever_routed: set[tuple[str, str]] = field(default_factory=set)  # (deployment, model) that served once
    # No LiteLLM: the boxes route (a balancer sends requests to every server that answers its health check);
    # `in_flight` is what the servers report, (box, port) -> requests in flight.
    boxes_route: bool = False
    in_flight: dict[tuple[str, int], int] = field(default_factory=dict)

    @classmethod
    def start(cls, revision: str, layout: Layout, recipes: Mapping[str, str], unmanaged: frozenset[str] = frozenset(),
              **kw: object) -> Sim:
        configs = {box: config(revision, box, rows, recipes) for box, rows in layout.items()}
        boxes = {}
        for box, cfg in configs.items():
            sim_box = SimBox(box, managed=box not in unmanaged, applied=revision, reported_at=0.0)
            sim_box.running = {s.name: Running(s, 0) for s in cfg.servers}
            boxes[box] = sim_box
        sim = cls({revision: configs}, revision, boxes, **kw)  # type: ignore[arg-type]
        sim.routed = {s.deployment for cfg in configs.values() for s in cfg.servers}
        return sim

    def commit(self, revision: str, layout: Layout, recipes: Mapping[str, str]) -> None:
        self.revisions[revision] = {box: config(revision, box, rows, recipes) for box, rows in layout.items()}
        self.target = revision
        for box in layout:
            self.boxes.setdefault(box, SimBox(box, applied="", reported_at=0.0))

    def config_at(self, box: str, revision: str) -> BoxConfig | None:
        return self.revisions.get(revision, {}).get(box)

    def verdicts(self) -> dict[tuple[str, int], str]:
        out: dict[tuple[str, int], str] = {}
        for box in self.boxes.values():
            served = self.served(box.name)
            wanted = {s.port: s for s in served.servers} if served is not None else {}
            for proc in box.running.values():
                key = (box.name, proc.spec.port)
                spec = wanted.get(proc.spec.port)
                if proc.ready_in != 0:
                    out[key] = "Loading"
                elif spec is not None and spec.model != proc.spec.model:
                    out[key] = "Foreign"  # another model answers there (as the judge's probe would see)
                elif spec is not None and spec.digest != proc.spec.digest:
                    out[key] = "Stale"
                else:
                    out[key] = "Healthy"
            for spec in wanted.values():
                out.setdefault((box.name, spec.port), "Pending")
        return out

    def served(self, box: str) -> BoxConfig | None:
        """What GET /vllm/config gives the box: its release for an agent box, else the target."""
        sim_box = self.boxes[box]
        release = self.releases.get(box)
        if sim_box.managed and release is not None:
            return self.config_at(box, release.revision)
        return self.config_at(box, self.target)

    def report(self, box: SimBox) -> ReportFacts | None:
        if not box.applied:
            return None
        return ReportFacts(box.applied, install_failed=self.late_verdict and bool(box.failed), failed=box.failed,
                           reported_at=box.reported_at)

    def step_input(self) -> StepInput:
        boxes: dict[str, BoxInput] = {}
        for name, box in self.boxes.items():
            release = self.releases.get(name)
            released_rev = release.revision if release is not None else box.applied
            boxes[name] = BoxInput(
                box=name, managed=box.managed, target=self.config_at(name, self.target),
                released=self.config_at(name, released_rev),
                last_good=self.config_at(name, release.last_good if release is not None else box.applied),
                report=self.report(box))
        rollout = self.rollout
        if rollout is not None and self.control is not None:
            rollout = Rollout(rollout.target, self.control, rollout.started_at, rollout.updated_at, "", rollout.waves)
            self.control = None
        return StepInput(target=self.target, now=self.now, boxes=boxes, releases=dict(self.releases),
                         rollout=rollout, verdicts=self.verdicts(),
                         routed=None if self.boxes_route else frozenset(self.routed),
                         max_unavailable=self.budgets, drain_s=self.drain_s, boxes_route=self.boxes_route,
                         in_flight=dict(self.in_flight))

    def one_pass(self) -> Step:
        verdicts = self.verdicts()
        result = step(self.step_input())
        self.steps.append(result)
        self.rollout = result.rollout
        self.releases = dict(result.releases)
        self.routed -= result.drain
        # The planner: a deployment exactly for the serving servers of the served configs, minus held out.
        wanted = set()
        for name in self.boxes:
            served = self.served(name)
            for spec in served.servers if served is not None else ():
                if verdicts.get((name, spec.port)) in ("Healthy", "Stale") and spec.deployment not in result.held_out:
                    wanted.add(spec.deployment)
        self.routed = wanted
        self.now += self.interval_s
        if self.boxes_route:
            assert result.drain == frozenset()  # nothing to delete without LiteLLM
            self.routed = {s.deployment for box in self.boxes.values() for s in (p.spec for p in box.running.values())
                           if verdicts.get((box.name, s.port)) in ("Healthy", "Stale")}
        for box in self.boxes.values():
            self.apply(box)
        self.measure(len(self.steps))
        return result

    def apply(self, box: SimBox) -> None:
        """The box agent: load what it is served (a manual box: nothing, a person restarts it)."""
        for proc in box.running.values():
            if proc.ready_in > 0:
                proc.ready_in -= 1
        if not box.managed:
            return
        served = self.served(box.name)
        revision = served.revision if served is not None else self.releases[box.name].revision
        if revision == box.applied:
            return
        wanted = {s.name: s for s in served.servers} if served is not None else {}
        for name in list(box.running):
            if name not in wanted:
                del box.running[name]
        for name, spec in wanted.items():
            old = box.running.get(name)
            if old is None or old.spec.digest != spec.digest:
                box.running[name] = Running(spec, -1 if spec.digest in self.bad_digests else self.load_passes)
            else:
                old.spec = spec
        box.applied = revision
        box.reported_at = self.now
        box.failed = frozenset()

    def measure(self, index: int) -> None:
        up: dict[str, tuple[str, Running]] = {}
        for box in self.boxes.values():
            for proc in box.running.values():
                up[proc.spec.deployment] = (box.name, proc)
            # a crash-looping server shows in the next report
            box.failed = frozenset(n for n, p in box.running.items() if p.ready_in < 0)
        for deployment in sorted(self.routed):
            found = up.get(deployment)
            if found is None or found[1].ready_in != 0:
                self.failed_requests.append((index, deployment))
        models: dict[str, int] = {}
        routed: dict[str, int] = {}
        out_on: dict[str, set[str]] = {}
        for deployment, (box_name, proc) in up.items():
            ok = deployment in self.routed and proc.ready_in == 0
            served_before = (deployment, proc.spec.model) in self.ever_routed  # a fresh server is not "out"
            models[proc.spec.model] = models.get(proc.spec.model, 0) + (0 if ok or not served_before else 1)
            if not ok and served_before:
                out_on.setdefault(proc.spec.model, set()).add(box_name)
            routed[proc.spec.model] = routed.get(proc.spec.model, 0) + (1 if ok else 0)
            if ok:
                self.ever_routed.add((deployment, proc.spec.model))
        self.unreachable.append(models)
        self.out_on.append(out_on)
        self.routed_per_model.append(routed)

    def run(self, passes: int = 200) -> int:
        """Passes until the rollout converges, halts or aborts (or `passes`)."""
        for n in range(1, passes + 1):
            self.one_pass()
            if self.rollout is not None and self.rollout.target == self.target and self.rollout.state in (
                    RolloutState.CONVERGED, RolloutState.HALTED, RolloutState.ABORTED):
                return n
        return passes
