"""The rollout's step function: one call per reconcile pass, a pure function of what the pass knows.

Rules (issue 14):
- a box whose config changes only in live fields (or not at all) is released at once;
- a boot change disrupts the servers it restarts or removes (`change.box_change`); for every model at
  most `max_unavailable` of its servers may be disrupted or not serving (Healthy or Stale, and routed in
  LiteLLM) at once; servers a change adds are not counted;
- make-before-break: a box whose change takes a server of model M out waits until every server of M that
  the target adds on another box is Healthy and routed;
- every disrupted server is drained first (its deployment deleted on purpose), and its box is released
  only once `drain_s` has passed since; without LiteLLM (`boxes_route`: the box gateway or an outside
  balancer routes) nothing is deleted, every server a box runs counts as routed, and the drain is a wait
  for the requests in flight that the disrupted servers report to reach 0 (at most `drain_s`);
- a released box whose changed servers are not Healthy within their grace, whose install failed or whose
  servers crash-loop halts the rollout and is rolled back to its last good revision;
- a new target starts a new rollout; pause stops releasing (draining boxes are routed again); abort also
  rolls released-but-unconverged boxes back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from fleetllm.core.fleet.model import DEFAULTS
from fleetllm.core.fleet.validate import gc_paused
from fleetllm.core.rollout.change import box_change, over_budget, servers_named
from fleetllm.core.rollout.model import (
    VERDICTS_UP,
    BoxConfig,
    BoxInput,
    BoxRelease,
    BoxState,
    Halt,
    ReleaseStatus,
    Rollout,
    RolloutState,
    ServerKey,
    ServerSpec,
    Step,
    StepInput,
)
from fleetllm_contract.division import BoxChange

DEFAULT_GRACE_S: int = DEFAULTS["/reconcile/health_grace_s"]  # fleet.yaml's (schemas/fleet.schema.json)
UNSETTLED = frozenset({BoxState.DRAINING, BoxState.RELEASED})


def current_rollout(inp: StepInput) -> tuple[Rollout, bool]:
    """The rollout this pass works on, and whether it is new (a new target starts a new rollout)."""
    if inp.rollout is not None and inp.rollout.target == inp.target:
        return inp.rollout, False
    return Rollout(target=inp.target, state=RolloutState.RUNNING, started_at=inp.now, updated_at=inp.now), True


def initial_release(box: BoxInput, now: float) -> BoxRelease:
    """A box seen for the first time runs what it reported (else it is new, and gets the target)."""
    if box.new:
        revision = ""  # nothing to disrupt: it is released the target at once
    else:
        revision = box.released.revision if box.released is not None else (
            box.report.revision if box.report is not None else "")
    since = box.report.reported_at if box.report is not None and revision else now  # it runs it since then
    return BoxRelease(box.box, revision, revision, min(since, now), BoxState.APPLIED)


def restart_rollout(release: BoxRelease, target: str) -> BoxRelease:
    """A new rollout: every box not on the target and not in flight (released) waits for it."""
    if release.state is not BoxState.RELEASED and release.revision != target:
        return replace(release, state=BoxState.WAITING, drain_started_at=None, reason="")
    return release


def server_key(box: str, server: ServerSpec) -> ServerKey:
    return (box, server.port)


def is_fresh(box: BoxInput, server: ServerSpec, last_good: BoxConfig | None, verdicts: Mapping[ServerKey, str]) -> bool:
    """A server the change adds: not in the box's last good config (for a box without the agent: one
    that never started). It is not a disruption and does not count against the budget."""
    if box.managed:
        return last_good is None or server.name not in last_good.by_name()
    return verdicts.get(server_key(box.box, server)) == "Pending"


def is_ready(box: str, server: ServerSpec, inp: StepInput) -> bool:
    """A new or restarted server is ready when it runs the new config (Healthy, not Stale) and is routed."""
    return inp.verdicts.get(server_key(box, server)) == "Healthy" and inp.routes(server.deployment)


@dataclass
class Work:
    """The step's working state (local to one call of `step`)."""

    inp: StepInput
    rollout: Rollout
    releases: dict[str, BoxRelease]
    served: dict[str, BoxConfig | None]  # the config each box is served after this step
    last_good: dict[str, BoxConfig | None]
    released: dict[str, str] = field(default_factory=dict)
    drain: set[str] = field(default_factory=set)
    rollbacks: dict[str, str] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    halt: Halt | None = None
    new_wave: bool = False
    _not_running: dict[str, list[tuple[str, ServerSpec, bool]]] | None = None
    # box_change by its configs' identities (each config is held by the value, so its id stays its own):
    # the step asks for the same few pairs of every box many times a pass.
    _changes: dict[tuple[int, int, float | None], tuple[BoxChange, BoxConfig | None, BoxConfig | None]] = \
        field(default_factory=dict)

    def change(self, old: BoxConfig | None, new: BoxConfig | None, card_gb: float | None) -> BoxChange:
        """`change.box_change(old, new, card_gb)`, computed once a step for each pair."""
        key = (id(old), id(new), card_gb)
        found = self._changes.get(key)
        if found is None:
            found = self._changes[key] = (box_change(old, new, card_gb), old, new)
        return found[0]

    def not_running(self) -> dict[str, list[tuple[str, ServerSpec, bool]]]:
        if self._not_running is None:
            self._not_running = not_running(self)
        return self._not_running

    def config_of(self, box: str, revision: str) -> BoxConfig | None:
        """The box's config at one of the revisions this step knows for it."""
        b = self.inp.boxes[box]
        for config in (b.target, b.released, b.last_good):
            if config is not None and config.revision == revision:
                return config
        return None

    def disrupted_by(self, box: str, release: BoxRelease) -> tuple[ServerSpec, ...]:
        """The servers of the box's served config that moving it to the target takes out."""
        b = self.inp.boxes[box]
        served = self.served[box]
        return servers_named(served, self.change(served, b.target, b.card_gb).disrupted)

    def reported(self, box: str, release: BoxRelease) -> bool:
        """The box reported applying its released revision since the release."""
        report = self.inp.boxes[box].report
        return report is not None and report.revision == release.revision and report.reported_at >= release.released_at

    def held_out(self) -> frozenset[str]:
        """Deployments kept out of LiteLLM: servers of boxes draining, or released and not yet applied."""
        ids: set[str] = set()
        for box, release in self.releases.items():
            if release.state is BoxState.DRAINING:
                ids.update(s.deployment for s in self.disrupted_by(box, release))
            elif release.state is BoxState.RELEASED:
                # Until the box applies its release, what it stops or restarts must not be routed again
                # (the pass's intended state may still hold the old server at that address); once it
                # applied, a restarted server is routed again only when it serves (Healthy, its probe
                # answered this pass): the box reports when supervisord runs it, before vLLM has loaded.
                change = self.change(self.last_good[box], self.served[box], self.inp.boxes[box].card_gb)
                restarted = servers_named(self.served[box], change.restarted)
                if not self.reported(box, release):
                    ids.update(s.deployment for s in servers_named(self.last_good[box], change.disrupted))
                    ids.update(s.deployment for s in restarted)
                else:
                    ids.update(s.deployment for s in restarted
                               if self.inp.verdicts.get(server_key(box, s)) != "Healthy")
        return frozenset(ids)


def _all_boxes(inp: StepInput) -> list[str]:
    return sorted(inp.boxes)


def out_of_service(work: Work) -> dict[str, set[ServerKey]]:
    """Per model, its servers that callers cannot reach now (not fresh ones), and those being drained."""
    inp = work.inp
    held = work.held_out()
    verdicts = inp.verdicts
    out: dict[str, set[ServerKey]] = {}
    for box in _all_boxes(inp):
        b = inp.boxes[box]
        config = work.served[box] if b.managed else b.target
        for server in config.servers if config is not None else ():
            key = (box, server.port)  # server_key, inlined: this loop runs over every server twice a pass
            # Up (serving callers): Healthy or Stale, routed (StepInput.routes), not held out.
            if (verdicts.get(key) in VERDICTS_UP and inp.routes(server.deployment)
                    and server.deployment not in held) or is_fresh(b, server, work.last_good.get(box), verdicts):
                continue
            out.setdefault(server.model, set()).add(key)
        release = work.releases.get(box)
        if release is not None and release.state is BoxState.DRAINING:
            for server in work.disrupted_by(box, release):
                out.setdefault(server.model, set()).add(server_key(box, server))
    return out


def incoming_not_ready(work: Work, model: str, except_box: str, leaving: bool = False) -> list[str]:
    """Servers of `model` that the target adds on other boxes and that are not yet Healthy and routed.
    `leaving` (the box stops a server of the model for good): also the ones the target changes there, so a
    model that loses a server restarts its others first, while the leaving one still serves."""
    return [f"{box}:{server.port}" for box, server, fresh in work.not_running().get(model, ())
            if box != except_box and (leaving or fresh)]


def not_running(work: Work) -> dict[str, list[tuple[str, ServerSpec, bool]]]:
    """Per model, the target's servers that do not run yet (box, server, whether the target adds it).
    Computed once a step: releasing a box in the step cannot make a target server run, nor stop one."""
    inp = work.inp
    found: dict[str, list[tuple[str, ServerSpec, bool]]] = {}
    for box in _all_boxes(inp):
        b = inp.boxes[box]
        for server in b.target.servers if b.target is not None else ():
            if not runs(work, box, server):
                fresh = is_fresh(b, server, work.last_good.get(box), inp.verdicts)
                found.setdefault(server.model, []).append((box, server, fresh))
    return found


def runs(work: Work, box: str, server: ServerSpec) -> bool:
    """The box runs this very server and it is ready: its box applied a release that has it (a verdict and
    a route are per address, and another server may still hold the address), Healthy and routed."""
    b = work.inp.boxes[box]
    if b.managed:
        release = work.releases.get(box)
        served = work.served.get(box)
        applied = release is not None and (release.state is BoxState.APPLIED or work.reported(box, release))
        if not applied or served is None or server not in served.servers:
            return False
    return is_ready(box, server, work.inp)


MAKE_BEFORE_BREAK = "make-before-break: "


def leaving_models(work: Work, box: str, disrupted: Iterable[ServerSpec]) -> set[str]:
    """The models of which the box stops a server for good (not in its target)."""
    target = work.inp.boxes[box].target
    staying = target.by_name() if target is not None else {}
    return {s.model for s in disrupted if s.name not in staying}


def awaited_boxes(work: Work, box: str, disrupted: tuple[ServerSpec, ...]) -> set[str]:
    """The boxes whose new (or, for a model the box stops, changed) servers its make-before-break waits for."""
    leaving = leaving_models(work, box, disrupted)
    return {other for model in {s.model for s in disrupted}
            for other, _, fresh in work.not_running().get(model, ()) if other != box and (fresh or model in leaving)}


def budget_refusal(work: Work, out: Mapping[str, set[ServerKey]], box: str,
                   disrupted: Iterable[ServerSpec], make_before_break: bool = True) -> str | None:
    """Why taking these servers out now would break a model's budget, or make-before-break (None: it
    would not)."""
    by_model: dict[str, set[ServerKey]] = {}
    for server in disrupted:
        by_model.setdefault(server.model, set()).add(server_key(box, server))
    leaving = leaving_models(work, box, disrupted)
    for model, keys in sorted(by_model.items()):
        budget = work.inp.budget(model)
        already = out.get(model, set())
        # A box is the smallest unit: one whose own servers of a model exceed the budget goes alone.
        if len(already | keys) > budget and (already - keys):
            names = ", ".join(f"{b}:{p}" for b, p in sorted(already)) or "none"
            return (f"waits for the disruption budget of {model}: {len(already)} of its servers out "
                    f"({names}), max_unavailable {budget}")
        incoming = incoming_not_ready(work, model, box, model in leaving) if make_before_break else []
        if incoming:
            return (f"{MAKE_BEFORE_BREAK}waits until {model}'s new server(s) {', '.join(incoming)} "
                    "are Healthy and routed")
    return None


def release_box(work: Work, box: str, revision: str, state: BoxState, wave: int | None = None) -> None:
    release = work.releases[box]
    work.releases[box] = replace(release, revision=revision, released_at=work.inp.now, state=state,
                                 drain_started_at=None, reason="", wave=release.wave if wave is None else wave)
    work.served[box] = work.config_of(box, revision)
    work.released[box] = revision


def roll_back(work: Work, box: str, reason: str) -> None:
    release = work.releases[box]
    last_good = release.last_good
    work.releases[box] = replace(release, revision=last_good, released_at=work.inp.now, state=BoxState.HALTED,
                                 drain_started_at=None, reason=reason)
    work.served[box] = work.last_good[box]
    work.released[box] = last_good
    work.rollbacks[box] = last_good


def undrain(work: Work, box: str, why: str) -> None:
    release = work.releases[box]
    if release.state is BoxState.DRAINING:
        work.releases[box] = replace(release, state=BoxState.WAITING, drain_started_at=None, reason=why)


def failure_of(work: Work, box: str, release: BoxRelease) -> str | None:
    """Why a released box failed (None: it has not, or not yet)."""
    inp = work.inp
    b = inp.boxes[box]
    served = work.served[box]
    change = work.change(work.last_good[box], served, b.card_gb)
    changed = servers_named(served, change.started | change.restarted)
    report = b.report
    if report is not None and report.revision == release.revision and report.reported_at >= release.released_at:
        # the crash first: the box agent reports a crash after its install as a failed install (issue 27)
        crashed = sorted(s.name for s in changed if s.name in report.failed)
        if crashed:
            return f"server(s) {', '.join(crashed)} crash-loop (the box reports them failed)"
        if report.install_failed:
            return f"the box reported that installing revision {release.revision[:12]} failed"
    grace = max((s.grace_s for s in changed), default=DEFAULT_GRACE_S)
    late = [s for s in changed if inp.verdicts.get(server_key(box, s)) != "Healthy"]
    if late and inp.now - release.released_at > grace:
        shown = ", ".join(f"{s.name} ({inp.verdicts.get(server_key(box, s), 'unobserved')})" for s in late)
        return f"server(s) {shown} not Healthy within {grace}s of the release"
    return None


def is_applied(work: Work, box: str, release: BoxRelease) -> bool:
    b = work.inp.boxes[box]
    served = work.served[box]
    if served is None:
        return True  # the box left the placement: nothing to wait for
    if not work.reported(box, release):
        return False
    change = work.change(work.last_good[box], served, b.card_gb)
    return all(is_ready(box, s, work.inp) for s in servers_named(served, change.started | change.restarted))


def settle(work: Work) -> None:
    """Released boxes: applied (their revision becomes the last good one), or failed (halt, roll back)."""
    for box in _all_boxes(work.inp):
        release = work.releases.get(box)
        if release is None or release.state is not BoxState.RELEASED:
            continue
        failure = failure_of(work, box, release)
        if failure is not None:
            reason = f"box {box}: {failure}; rolled back to {release.last_good[:12]}"
            roll_back(work, box, reason)
            if work.halt is None:
                work.halt = Halt(box, reason, release.last_good)
            continue
        if is_applied(work, box, release):
            work.releases[box] = replace(release, state=BoxState.APPLIED, last_good=release.revision, reason="")
            work.last_good[box] = work.served[box]
        else:
            work.why[box] = "released: waits for its changed servers to be Healthy and routed"


def finish_drains(work: Work) -> None:
    """Draining boxes whose drain time has passed are released the target."""
    for box in _all_boxes(work.inp):
        release = work.releases.get(box)
        if release is None or release.state is not BoxState.DRAINING:
            continue
        started = release.drain_started_at if release.drain_started_at is not None else work.inp.now
        if work.inp.boxes_route:
            drain_in_flight(work, box, release, started)
            continue
        routed = work.inp.routed
        still = sorted(s.deployment for s in work.disrupted_by(box, release)
                       if routed is None or s.deployment in routed)
        if still:  # a failed delete is retried by the pass; the box restarts only once they are gone
            work.why[box] = f"draining: waits for {', '.join(still)} to leave LiteLLM"
        elif work.inp.now - started >= work.inp.drain_s:
            release_box(work, box, work.rollout.target, BoxState.RELEASED)
        else:
            work.why[box] = f"draining: released {work.inp.drain_s - (work.inp.now - started):.0f}s from now"


def drain_in_flight(work: Work, box: str, release: BoxRelease, started: float) -> None:
    """A drain without LiteLLM: the box is released once its disrupted servers report no request in flight
    (nor queued), or once `drain_s` has passed (requests that never finish, counts that cannot be read)."""
    inp = work.inp
    disrupted = work.disrupted_by(box, release)
    busy = {f"{box}:{s.port}": inp.in_flight.get(server_key(box, s)) for s in disrupted}
    waiting = {k: n for k, n in busy.items() if n is None or n > 0}
    left = inp.drain_s - (inp.now - started)
    if not waiting or left <= 0:
        release_box(work, box, work.rollout.target, BoxState.RELEASED)
        return
    shown = ", ".join(f"{k} ({'count unknown' if n is None else f'{n} in flight'})" for k, n in sorted(waiting.items()))
    work.why[box] = f"draining: waits for the requests in flight on {shown}, at most {left:.0f}s more"


def start_releases(work: Work) -> None:
    """Waiting boxes: live-only changes at once; boot changes under the budget, after a drain."""
    inp = work.inp
    target = work.rollout.target
    out = out_of_service(work)
    for box in _all_boxes(inp):
        b = inp.boxes[box]
        release = work.releases.get(box)
        if release is None or release.revision == target or release.state in UNSETTLED:
            continue
        if b.left:  # placed neither at its release nor at the target: nothing to disrupt (it retires)
            release_box(work, box, target, BoxState.APPLIED)
            work.releases[box] = replace(work.releases[box], last_good=target)
            continue
        if work.served[box] is None and release.revision:
            work.why[box] = f"waits: its released revision {release.revision[:12]} cannot be read or rendered"
            continue
        change = work.change(work.served[box], b.target, b.card_gb)
        if not change.boot:
            release_box(work, box, target, BoxState.APPLIED)  # live fields only: nothing restarts
            work.releases[box] = replace(work.releases[box], last_good=target)
            work.last_good[box] = work.served[box]
            continue
        if inp.routed is None and not inp.boxes_route:
            work.why[box] = "waits: LiteLLM was not listed this pass"
            continue
        disrupted = work.disrupted_by(box, release)
        refusal = budget_refusal(work, out, box, disrupted)
        if refusal is not None:
            work.why[box] = refusal
            continue
        start_box(work, box, release, disrupted, out)
    break_a_cycle(work, out)


def break_a_cycle(work: Work, out: dict[str, set[ServerKey]]) -> None:
    """Boxes that wait only for each other's new servers (two models swapping places with no spare slot)
    would wait for ever: when nothing is in flight and nothing started, the first of them goes, under the
    budget, without make-before-break (its model is short for a while; the status says so)."""
    if any(r.state in UNSETTLED for r in work.releases.values()):
        return
    waiting = [b for b, r in work.releases.items() if r.revision != work.rollout.target and work.why.get(b)]
    if not waiting or not all(work.why[b].startswith(MAKE_BEFORE_BREAK) for b in waiting):
        return  # a box waits for something else (a budget): not a cycle of make-before-break
    for box in _all_boxes(work.inp):
        if not work.why.get(box, "").startswith(MAKE_BEFORE_BREAK):
            continue
        release = work.releases[box]
        disrupted = work.disrupted_by(box, release)
        # A cycle only if every server it waits for is on a box that itself waits: a server coming up on a
        # box without the agent (a person restarts it), or on one already released, is worth waiting for
        # (taking the last servers of a model out while its others come up elsewhere is never needed).
        if not awaited_boxes(work, box, disrupted) <= set(waiting):
            continue
        if budget_refusal(work, out, box, disrupted, make_before_break=False) is None:
            start_box(work, box, release, disrupted, out)
            work.why[box] = ("make-before-break is impossible (boxes wait for each other's new servers): "
                             "released first, its models are short until their new servers serve")
            return


def start_box(work: Work, box: str, release: BoxRelease, disrupted: tuple[ServerSpec, ...],
              out: dict[str, set[ServerKey]]) -> None:
    """Drain the box's disrupted servers (or release it at once when it disrupts none, or drain_s is 0)."""
    inp = work.inp
    for server in disrupted:
        out.setdefault(server.model, set()).add(server_key(box, server))
    wave = work.rollout.waves + 1
    if not inp.boxes_route:  # without LiteLLM there is no deployment to delete: the drain waits for requests
        work.drain.update(s.deployment for s in disrupted)
    if not disrupted or inp.drain_s <= 0:
        release_box(work, box, work.rollout.target, BoxState.RELEASED, wave)
    else:
        work.releases[box] = replace(release, state=BoxState.DRAINING, drain_started_at=inp.now, reason="",
                                     wave=wave)
        work.why[box] = f"draining: released in {inp.drain_s}s"
    work.new_wave = True


def apply_controls(work: Work) -> None:
    """Paused, halted or aborted: nothing new; drains stop (their servers are routed again); an abort
    rolls released but unconverged boxes back."""
    state = work.rollout.state
    for box in sorted(work.releases):
        undrain(work, box, f"rollout {state}")
        release = work.releases.get(box)
        if state is RolloutState.ABORTED and release is not None and release.state is BoxState.RELEASED:
            roll_back(work, box, "rollout aborted: rolled back to its last good revision")


def converged(work: Work) -> bool:
    return all(r.revision == work.rollout.target and r.state is BoxState.APPLIED for r in work.releases.values())


def begin(inp: StepInput) -> Work:
    rollout, new = current_rollout(inp)
    releases: dict[str, BoxRelease] = {}
    served: dict[str, BoxConfig | None] = {}
    last_good: dict[str, BoxConfig | None] = {}
    for box in _all_boxes(inp):
        b = inp.boxes[box]
        if not b.managed:
            continue
        release = inp.releases.get(box) or initial_release(b, inp.now)
        releases[box] = restart_rollout(release, inp.target) if new or box not in inp.releases else release
        served[box] = b.released
        last_good[box] = b.last_good if b.last_good is not None else (
            b.released if release.last_good == release.revision else None)
    return Work(inp, rollout, releases, served, last_good)


def step(inp: StepInput) -> Step:
    """One pass of the rollout. See the module's docstring for the rules."""
    with gc_paused():  # its records are short-lived and hold no cycles (fleet.validate.gc_paused)
        return _step(inp)


def _step(inp: StepInput) -> Step:
    work = begin(inp)
    if work.rollout.state is RolloutState.CONVERGED and not converged(work):
        # a box that took the agent (or rejoined) after the rollout converged: it goes on
        work.rollout = replace(work.rollout, state=RolloutState.RUNNING)
    settle(work)
    if work.halt is not None and work.rollout.state in (RolloutState.RUNNING, RolloutState.PAUSED):
        work.rollout = replace(work.rollout, state=RolloutState.HALTED, reason=work.halt.reason)
    if work.rollout.state is RolloutState.RUNNING:
        finish_drains(work)
        start_releases(work)
    else:
        apply_controls(work)
    rollout = work.rollout
    if work.new_wave:
        rollout = replace(rollout, waves=rollout.waves + 1)
    if rollout.state is RolloutState.RUNNING and converged(work):
        rollout = replace(rollout, state=RolloutState.CONVERGED, reason="")
    if rollout != inp.rollout:
        rollout = replace(rollout, updated_at=inp.now)
    work.rollout = rollout
    status = {box: status_of(work, box) for box in sorted(work.releases)}
    return Step(
        rollout=rollout,
        releases=MappingProxyType({box: r if r.reason == status[box].why else replace(r, reason=status[box].why)
                                   for box, r in work.releases.items()}),
        released=MappingProxyType(dict(work.released)),
        drain=frozenset(work.drain),
        held_out=work.held_out(),
        rollbacks=MappingProxyType(dict(work.rollbacks)),
        halt=work.halt,
        status=MappingProxyType(status),
        out=MappingProxyType({m: tuple(sorted(k)) for m, k in sorted(out_of_service(work).items())}),
    )


def went_past_budget(work: Work, box: str, release: BoxRelease) -> str:
    """Why a box in flight has more of a model's servers out than the model's budget ("": it has not)."""
    if release.state is BoxState.DRAINING:
        out = work.disrupted_by(box, release)
    elif release.state is BoxState.RELEASED:
        last_good = work.last_good[box]
        out = servers_named(last_good, work.change(last_good, work.served[box], work.inp.boxes[box].card_gb).disrupted)
    else:
        return ""
    over = over_budget(out, work.inp.budget)
    if not over:
        return ""
    shown = "; ".join(f"{n} servers of {model} out at once, over its max_unavailable {work.inp.budget(model)}"
                      for model, n in over.items())
    return (f"went alone past the budget: {shown} (a box is the smallest unit of release: it was released only "
            f"when no other server of {' or '.join(over)} was out)")


def status_of(work: Work, box: str) -> ReleaseStatus:
    release = work.releases[box]
    report = work.inp.boxes[box].report
    why = work.why.get(box) or (release.reason if release.state is BoxState.HALTED else "")
    if not why and release.state is BoxState.WAITING and work.rollout.state is not RolloutState.RUNNING:
        why = f"rollout {work.rollout.state}"
    note = went_past_budget(work, box, release)
    why = f"{why}; {note}" if why and note else why or note
    return ReleaseStatus(box, release.state, release.revision, report.revision if report is not None else None, why)
