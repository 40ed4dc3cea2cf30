"""The box agent: `python3 -S fleetllm-box.pyz agent`, the Supervisor program `fleetllm-agent`.

The installer installs it when the box JSON has `"agent": {"poll_s": N}` (agentsetup.py) and removes it
when the JSON has none. It polls GET /vllm/config every N seconds (+-20 % jitter) with `If-None-Match`
(an unchanged config is a 304 and costs nothing); it keeps an ETag only for the body the box runs, never
for one it refused (a cut answer must not become a 304 for ever, issue 27). When the body it is served
differs from the one the box applied, it runs the installer's own code path on it (main.Installer: box
JSON check, fit check, programs written, `supervisorctl reread` + `update` so only programs whose config
changed restart and programs that left are stopped and removed, supervisord's verdict, POST /vllm/report
with `"agent": true`).

After an apply it reported as installed, the agent keeps watching that config's programs: on each poll,
one `supervisorctl status` of them. supervisord's verdict at install time can come before a server that
loads for minutes crash-loops (it passed `startsecs` once, then crashed, and its restarts fail), so a
program that goes FATAL later is reported `failed` for that revision (with the server and supervisord's
state), once per failure, not once per poll (`crashed`, a pure decision): the rollout halts on it
(fleetllm.core.rollout.step.failure_of) instead of waiting out its health grace (issue 27). So is a program
that never goes FATAL but has not stayed up: one that lives past `startsecs` and dies again (RUNNING ->
EXITED -> STARTING under `autorestart`), or cycles BACKOFF -> STARTING under a large `startretries`. The
looks count its restarts (`observe`: BACKOFF, EXITED, or RUNNING under a new pid) and CRASH_RESTARTS of them
within CRASH_WINDOW_S make it failed, reported once the same way (whichever comes first, this or FATAL).

A retiring box (it left the placement) is served a box JSON with no servers and no agent: applied as any
other, it removes every fleetllm program, this agent's own included (issue 25).

Safety: a failed fetch (connection, timeout, 5xx, 404, 401/403), invalid JSON or a config that does
not fit changes nothing on the box: the running servers keep serving. A refused config is reported
once (as the installer would) and not tried again until the control plane serves another; a failure
that may pass (writing files, supervisord, an installer holding the install lock) is tried again with
exponential back-off, as a failed fetch is. Every iteration catches everything and logs one line; no
traceback is printed (it could quote the box JSON). SIGTERM stops it at once between polls; during an
apply it stops waiting for supervisord's verdict, reports, and exits.

The agent never restarts itself through the `update` it runs (it would be stopped mid-apply): it
updates every other fleetllm program by name, and when its own program changed or left (the JSON
dropped the agent) it starts `supervisorctl update fleetllm-agent` in its own session and lets
supervisord stop it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import FrameType

from fleetllm_contract.boxjson import AGENT_POLL_S, AGENT_PROGRAM, GATEWAY_PROGRAM
from fleetllm_contract.report import ReportOutcome, ServerState
from fleetllm_installer import __version__, logs
from fleetllm_installer.boxgateway import GatewayPlan
from fleetllm_installer.fetch import Client, FetchError, check_url
from fleetllm_installer.handover import (
    HandoverError,
    ProgramStatus,
    WriteResult,
    program_status,
    reread,
    update_groups,
    update_later,
)
from fleetllm_installer.main import EXIT_OK, EXIT_USAGE, Installer, log, resolve_vllm, save_applied
from fleetllm_installer.settings import Settings, SettingsError, load
from fleetllm_installer.units import PREFIX, Unit, program_name

DEFAULT_POLL_S = 30
JITTER = 0.2
MAX_BACKOFF_S = 600.0
BUSY_RETRY_S = 5.0  # another install held the lock: look again this soon
LEAVE_GRACE_S = 60.0  # after asking supervisord to remove it, how long the agent waits to be stopped
USER_AGENT = f"fleetllm-agent/{__version__}"
OWN_PROGRAM = program_name(AGENT_PROGRAM)


def delay_s(poll_s: float, failures: int, uniform: Callable[[float, float], float] = random.uniform) -> float:
    """The wait before the next poll: the poll interval, doubled per failure in a row up to
    MAX_BACKOFF_S (never below the interval), each +-20 % at random so boxes do not poll in step."""
    base = poll_s if failures <= 0 else max(poll_s, min(poll_s * 2.0 ** min(failures, 16), MAX_BACKOFF_S))
    return base * uniform(1.0 - JITTER, 1.0 + JITTER)


def installer_args() -> argparse.Namespace:
    """The arguments of a fresh install by the provisioning script (vast.sh: --handover update)."""
    return argparse.Namespace(dry_run=False, config_file=None, handover="update", assume_gpus=None)


def read_state(settings: Settings) -> dict[str, object]:
    """What the installer (or the agent) last applied, as save_applied wrote it; empty when unreadable."""
    try:
        state = json.loads(settings.agent_state_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


class AgentInstaller(Installer):
    """The installer's run on a config the agent fetched. It hands supervisord every fleetllm program
    but its own; `own_change` says what `reread` found for the agent's program. `applied_meanwhile`: the
    body was applied by the time this run held the install lock (the installer run that started the
    agent writes what it applied last, just before it lets go of the lock), so this run did nothing."""

    own_change: str | None = None
    applied_meanwhile = False

    def install(self, units: list[Unit], gateway: GatewayPlan | None, agent: tuple[Unit, bytes] | None = None) -> int:
        if self.body_sha256 is not None and read_state(self.settings).get("sha256") == self.body_sha256:
            self.applied_meanwhile = True
            return EXIT_OK
        return super().install(units, gateway, agent)

    def update_programs(self, written: WriteResult) -> None:
        changes = reread(self.settings)
        self.own_change = changes.get(OWN_PROGRAM)
        update_groups(self.settings, (name for name in changes if name.startswith(PREFIX) and name != OWN_PROGRAM))


GIVEN_UP = frozenset({"FATAL"})  # supervisord stopped restarting it (startretries starts that each ended sooner)
# A program that has not stayed up: supervisord still restarts it, so it never goes FATAL, but the agent
# saw it restart CRASH_RESTARTS times within CRASH_WINDOW_S (installer/README.md, "Box agent").
CRASH_RESTARTS = 3
CRASH_WINDOW_S = 600.0


@dataclass(frozen=True)
class Seen:
    """What the watch remembers of one program between looks: the state the last look found, the pid it
    last saw RUNNING under, whether the end of that process was counted already (a look found it BACKOFF
    or EXITED since), and the restarts it saw within CRASH_WINDOW_S: (when, what showed it) with `when` on
    the agent's monotonic clock."""

    state: str | None = None
    pid: int | None = None
    ended: bool = False
    restarts: tuple[tuple[float, str], ...] = ()


def observe(seen: Seen, status: ProgramStatus, now: float) -> Seen:
    """Pure: the memory of one program after a look at it. One restart is counted per process that ended,
    as far as `supervisorctl status` shows it: a look that finds BACKOFF (a start ended before startsecs)
    or EXITED (it ended after RUNNING; autorestart starts it again) when the look before found something
    else, or RUNNING under another pid than it last ran under with no end counted since (it ended and
    started again between two looks). Looks that all find BACKOFF count one (supervisorctl shows nothing
    that tells two BACKOFF periods apart); STARTING counts nothing (a first start shows it too). Restarts
    seen CRASH_WINDOW_S or longer ago are forgotten."""
    recent = tuple(r for r in seen.restarts if now - r[0] < CRASH_WINDOW_S)
    if status.state in ("BACKOFF", "EXITED"):
        counted = (*recent, (now, status.state)) if status.state != seen.state else recent
        return Seen(status.state, seen.pid, True, counted)
    if status.state == "RUNNING" and status.pid is not None:
        restarted = seen.pid is not None and status.pid != seen.pid and not seen.ended
        return Seen(status.state, status.pid, False,
                    (*recent, (now, "RUNNING under a new pid")) if restarted else recent)
    return replace(seen, state=status.state, restarts=recent)


@dataclass(frozen=True)
class Watch:
    """The programs of a config the agent applied and reported as installed: `programs` maps each server
    (and GATEWAY_PROGRAM for the box gateway) to its Supervisor program; `reported` holds the servers whose
    failure the control plane already knows (from the install's report, or a `failed` report since);
    `seen`, what the looks so far saw of each server's program (`observe`)."""

    programs: Mapping[str, str]
    reported: frozenset[str] = frozenset()
    seen: Mapping[str, Seen] = field(default_factory=dict)


def crashed(watch: Watch, statuses: Mapping[str, ProgramStatus], now: float) -> tuple[dict[str, str], Watch]:
    """Pure: the servers that failed and are not reported yet, each with what was seen (empty: send
    nothing), and the watch after. A server failed when supervisord gave up on its program (FATAL) or
    when the program has not stayed up: CRASH_RESTARTS restarts seen within CRASH_WINDOW_S (`observe`),
    however supervisord shows it at this look. `statuses`: program -> how supervisord shows it; a program
    it does not list (unknown, or the status call answered nothing) changes nothing. A reported server
    that runs again with no restart seen within the window (fixed, or restarted by hand once) leaves
    `reported`, so a later failure of it is a new one; one that keeps restarting stays reported, once."""
    seen = dict(watch.seen)
    failed: dict[str, str] = {}
    rearmed: set[str] = set()
    for server, program in watch.programs.items():
        status = statuses.get(program)
        if status is None:
            continue
        memory = seen[server] = observe(seen.get(server, Seen()), status, now)
        if status.state in GIVEN_UP:
            failed[server] = f"supervisord gave up on {program} ({status.state})"
        elif len(memory.restarts) >= CRASH_RESTARTS:
            span = now - memory.restarts[0][0]
            shown = ", ".join(dict.fromkeys(what for _, what in memory.restarts))
            failed[server] = (f"{program} did not stay up: {len(memory.restarts)} restarts seen in "
                              f"{span:.0f} s (supervisord showed {shown}; it is {status.state} now)")
        elif status.state == "RUNNING" and not memory.restarts:
            rearmed.add(server)
    reported = (watch.reported - rearmed) | failed.keys()
    new = {server: what for server, what in failed.items() if server not in watch.reported}
    return new, replace(watch, reported=frozenset(reported), seen=seen)


def watch_of(installer: Installer) -> Watch | None:
    """What to watch after `installer` applied and reported installed: its servers and box gateway."""
    box = installer.box
    if box is None:
        return None
    programs = {server.name: program_name(server.name) for server in box.servers}
    if box.gateway is not None:
        programs[GATEWAY_PROGRAM] = program_name(GATEWAY_PROGRAM)
    if not programs:
        return None
    return Watch(programs, frozenset(name for name, state in installer.states.items()
                                     if name in programs and state is ServerState.FAILED))


@dataclass
class Outcome:
    """What one poll did: `fetch` is 200, 304 or "failed"; `result` is "applied", "refused" (reported,
    not tried again), "retry" (tried again after a back-off), "busy" (another install held the lock),
    "same" (the body the box already runs), "error" (an internal error), or None (nothing to do)."""

    fetch: int | str
    result: str | None = None


class Agent:
    def __init__(self, settings: Settings, client: Client, *, stop: threading.Event | None = None,
                 uniform: Callable[[float, float], float] = random.uniform,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self.client = client
        self.stop = stop or threading.Event()
        self.uniform = uniform
        self.etag: str | None = None
        self.applied: str | None = None  # sha256 of the box JSON the box runs
        self.refused: str | None = None  # sha256 of a box JSON refused (reported once)
        self.poll_s: int = DEFAULT_POLL_S
        self.poll_known = False  # poll_s came from a box JSON (the state file or a served one), not the default
        self.failures = 0
        self.started = False  # run() said how often it polls: later changes of the interval are logged
        self.leaving = False  # the JSON dropped the agent: supervisord removes it
        self.busy = False  # the last poll found another install running
        self.fetch_failed = False
        self.watch: Watch | None = None  # the programs of the last config this agent applied
        self.watched: Installer | None = None  # that apply: what a `failed` report about it says
        self.load_state()

    def load_state(self) -> None:
        """What the installer (or this agent before a restart) applied; nothing when unreadable."""
        state = read_state(self.settings)
        sha256 = state.get("sha256")
        if isinstance(sha256, str):
            self.applied = sha256
        poll = state.get("poll_s")
        if isinstance(poll, int) and AGENT_POLL_S[0] <= poll <= AGENT_POLL_S[1]:
            self.set_poll(poll)

    def set_poll(self, poll_s: int) -> None:
        """The interval of the box JSON (fleet.yaml rollout.poll_s); a change is logged, so that the agent's
        log never states another interval than the one it polls at."""
        changed = poll_s != self.poll_s
        self.poll_s, self.poll_known = poll_s, True
        if changed and self.started:
            log(f"agent: now polling about every {poll_s} s (rollout.poll_s of the box JSON)")

    def next_delay(self) -> float:
        if self.busy:
            return delay_s(min(self.poll_s, BUSY_RETRY_S), 0, self.uniform)
        return delay_s(self.poll_s, self.failures, self.uniform)

    def poll(self) -> Outcome:
        """One poll, and an apply when the served config changed, then a look at the programs of the
        config applied. Raises nothing it can catch."""
        try:
            outcome = self._poll()
        except Exception as exc:  # a bug must not stop the agent; no traceback (it may quote the JSON)
            self.failures += 1
            log(f"agent: internal error ({type(exc).__name__}); the box keeps its programs; "
                f"next poll in {self.next_delay():.0f} s")
            outcome = Outcome("failed", "error")
        try:
            self.check_programs()
        except Exception as exc:  # as above
            log(f"agent: internal error while looking at its programs ({type(exc).__name__})")
        return outcome

    def check_programs(self) -> None:
        """One `supervisorctl status` of the programs of the config this agent applied; a `failed` report
        for its revision when one failed (supervisord gave up on it, or it has not stayed up) since it was
        last reported."""
        if self.watch is None or self.watched is None or self.leaving:
            return
        try:
            statuses = program_status(self.settings, self.watch.programs.values())
        except HandoverError as exc:
            log(f"agent: cannot ask supervisord how its programs are: {exc}")
            return
        new, self.watch = crashed(self.watch, statuses, self.clock())
        if not new:
            return
        installer = self.watched
        failed = sorted(new)
        installer.states = {**installer.states, **dict.fromkeys(failed, ServerState.FAILED)}
        revision = installer.box.revision if installer.box is not None else "unknown"
        message = (f"after revision {revision} was reported installed, {'; '.join(new[s] for s in failed)}: "
                   f"see their logs in {self.settings.log_dir}")
        log(f"agent: {message}")
        installer.report(ReportOutcome.FAILED, message)

    def _poll(self) -> Outcome:
        self.busy = False
        try:
            answer = self.client.poll_config(self.etag)
        except FetchError as exc:
            self.failures += 1
            self.fetch_failed = True
            log(f"agent: {exc}; the box keeps its programs; next poll in about {self.next_delay():.0f} s")
            return Outcome("failed")
        if self.fetch_failed:
            log("agent: the control plane answers again")
        self.fetch_failed = False
        if answer.status == 304:
            self.failures = 0
            return Outcome(304)
        digest = hashlib.sha256(answer.body).hexdigest()
        if digest not in (self.applied, self.refused):
            self.load_state()  # an installer run (which started this agent) may have applied it meanwhile
        if digest in (self.applied, self.refused):
            self.failures = 0
            # An ETag is kept only for the body the box runs: one of a refused body (which may have been
            # cut short in a way the fetch could not see) would turn every later poll into a 304.
            self.etag = answer.etag if digest == self.applied else None
            return Outcome(answer.status, "same")
        log("agent: the served box JSON changed; applying it")
        installer = AgentInstaller(installer_args(), self.settings, client=self.client, fetched=answer.body,
                                   agent=True)
        installer.lock_wait_s = 0.0
        installer.stopping = self.stop.is_set
        code = installer.run()
        if code != EXIT_OK and installer.busy:  # an installer run applies (and started this agent): soon again
            self.busy = True
            log(f"agent: an install runs; the served box JSON is looked at again in about {self.next_delay():.0f} s")
            return Outcome(answer.status, "busy")
        if code == EXIT_OK and installer.applied_meanwhile:  # the installer run that held the lock applied it
            self.load_state()
            self.failures = 0
            self.etag = answer.etag
            return Outcome(answer.status, "same")
        if code != EXIT_OK and installer.retry:
            self.failures += 1
            self.watch = self.watched = None  # it may have written and restarted programs: not the watched config's
            log(f"agent: the apply did not finish; it is tried again in about {self.next_delay():.0f} s")
            return Outcome(answer.status, "retry")
        self.failures = 0
        box = installer.box
        if code != EXIT_OK:
            self.etag = None  # the next poll fetches the body again; an unchanged one is not reported again
            self.refused = digest
            log("agent: the served box JSON was refused (reported); the box keeps its programs until "
                "the control plane serves another")
            return Outcome(answer.status, "refused")
        self.applied, self.refused = digest, None
        self.etag = answer.etag
        self.watch, self.watched = watch_of(installer), installer
        if box is not None and box.agent is not None:
            self.set_poll(box.agent.poll_s)
            try:
                save_applied(self.settings, digest, self.poll_s)
            except OSError as exc:
                log(f"agent: cannot write {exc.filename}: {exc.strerror}")
        self.own_program(installer.own_change)
        return Outcome(answer.status, "applied")

    def own_program(self, change: str | None) -> None:
        """The agent's own program changed or left: supervisord restarts or removes it (and so stops us)."""
        if change not in ("changed", "disappeared"):
            return
        log("agent: the box JSON has no agent any more: removing it" if change == "disappeared"
            else "agent: its own program changed: supervisord restarts it")
        try:
            update_later(self.settings, OWN_PROGRAM)
        except HandoverError as exc:
            log(f"agent: {exc}")
            return
        self.leaving = change == "disappeared"

    def run(self) -> int:
        if self.poll_known:
            log(f"agent: polling {self.settings.url}/vllm/config about every {self.poll_s} s")
        else:  # the installer that started this agent may not have saved the box JSON's interval yet
            log(f"agent: polling {self.settings.url}/vllm/config, about every {self.poll_s} s until a box JSON "
                "gives its rollout.poll_s")
        self.started = True
        while not self.stop.is_set():
            self.poll()
            if self.leaving:
                self.stop.wait(LEAVE_GRACE_S)
                break
            self.stop.wait(self.next_delay())
        log("agent: stopped")
        return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fleetllm-agent", description="Poll GET /vllm/config and apply a "
                                     "changed box JSON as the installer does (the Supervisor program fleetllm-agent).")
    parser.add_argument("--once", action="store_true", help="poll once (and apply a change), then exit")
    logs.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        logs.setup(args, "fleetllm-agent")
    except ValueError as exc:
        parser.error(str(exc))
    try:
        settings = resolve_vllm(load())
        assert settings.url is not None
        assert settings.fleet_key is not None
        assert settings.host is not None
        check_url(settings.url)
    except (SettingsError, FetchError) as exc:
        log(f"agent: {exc}")
        return EXIT_USAGE
    client = Client(settings.url, settings.fleet_key, settings.host, settings.ca_bundle, deadline_s=0.0,
                    user_agent=USER_AGENT, log=log)
    agent = Agent(settings, client)

    def stop(signum: int, frame: FrameType | None) -> None:
        agent.stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.once:
        outcome = agent.poll()
        return EXIT_OK if outcome.result in (None, "same", "applied") and outcome.fetch != "failed" else 1
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
