"""The box installer: from the box JSON to vLLM servers under Supervisor, run once at boot.

1. settings from the environment (settings.py);  2. GET /vllm/config with retries, or --config-file
(fetch.py, boxjson.py);  3. fit check over every GPU and the disk and 4. card division (fit.py);
5. one Supervisor program per server, and one for the box gateway when the JSON has one (boxgateway.py),
stale ones removed (units.py, handover.py);  6. start-up ordering by the launcher each program runs
(launcher.py);  7. hand-over to
supervisord and its verdict on each program (running, or given up), then POST /vllm/report (never
fails the box).

Exit codes: 0 installed (or dry run shown), 1 failed (fetch, JSON, fit, Supervisor), 2 usage or
environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fleetllm_contract.report import ReportOutcome, ServerState
from fleetllm_installer import __version__, logs
from fleetllm_installer.agentsetup import plan_agent, remove_agent, write_agent
from fleetllm_installer.boxgateway import (
    BoxGatewayError,
    GatewayPlan,
    check_config,
    plan_gateway,
    remove_gateway,
    write_gateway,
)
from fleetllm_installer.boxjson import BoxConfig, BoxJsonError, parse_text
from fleetllm_installer.fetch import Client, FetchError, check_url
from fleetllm_installer.fit import FitResult, check_fit
from fleetllm_installer.handover import (
    HandoverError,
    LockBusyError,
    WriteResult,
    exec_supervisord,
    foreign_vllm_units,
    install_lock,
    owned_units,
    program_states,
    reread_and_update,
    write_atomic,
    write_units,
)
from fleetllm_installer.hardware import Gpu, ProbeError, cached_weights_gb, free_disk_gb, probe_gpus
from fleetllm_installer.report import build_report, server_state
from fleetllm_installer.running import read_running
from fleetllm_installer.settings import SAFE_PATH, Settings, SettingsError, load
from fleetllm_installer.units import STARTRETRIES, Unit, UnitError, render_unit

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
HANDOVERS = ("update", "exec", "none")
REPORT_DEADLINE_S = 60.0  # retries of POST /vllm/report, never longer than the fetch deadline
SETTLING = frozenset({"STARTING", "BACKOFF"})  # Supervisor has not decided yet
SETTLE_MARGIN_S = 15  # Supervisor's back-off between retries (1 + 2 + 3 s) and slack
SETTLE_POLL_S = 1.0
LOCK_WAIT_S = 900.0  # an installer waits this long for a box agent's apply to finish


def log(message: str) -> None:
    logs.log(message, logging.WARNING if message.startswith(("warning:", "would fail:")) else logging.INFO)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="fleetllm-installer",
        description="Fetch this box's servers from the control plane and run them under Supervisor.",
        epilog="Environment: LLMAO_HOST, FLEETLLM_URL (or ASFQUART_URL), FLEETLLM_FLEET_KEY (or FLEET_KEY), "
               "optional FLEETLLM_CA_BUNDLE, FLEETLLM_DATA_DIR (or DATA_DIRECTORY), FLEETLLM_SUPERVISOR_CONF_DIR, "
               "FLEETLLM_SUPERVISOR_CONFIG, FLEETLLM_VLLM_BIN, FLEETLLM_HF_HOME, FLEETLLM_LISTEN_HOST, "
               "FLEETLLM_START_TIMEOUT_S, FLEETLLM_STARTSECS, FLEETLLM_FETCH_DEADLINE_S, FLEETLLM_GATEWAY_PYTHON.")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the Supervisor files that would be written; change nothing")
    parser.add_argument("--config-file", metavar="FILE", type=Path,
                        help="read the box JSON from FILE instead of GET /vllm/config (no report is sent)")
    parser.add_argument("--handover", choices=HANDOVERS, default="update",
                        help="update: supervisorctl reread + update (supervisord already runs, as on Vast); "
                             "exec: become `supervisord -n` (a container's main process, as on RunPod); "
                             "none: only write the files (default: update)")
    parser.add_argument("--assume-gpus", metavar="COUNTxGB",
                        help="with --dry-run on a machine without GPUs: divide COUNT cards of GB each (e.g. 1x80)")
    parser.add_argument("--version", action="version", version=f"fleetllm-installer {__version__}")
    logs.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.assume_gpus and not args.dry_run:
        parser.error("--assume-gpus is only for --dry-run")
    if args.assume_gpus and not re.match(r"^[1-9][0-9]?x[0-9]+(\.[0-9]+)?\Z", args.assume_gpus):
        parser.error(f"--assume-gpus {args.assume_gpus!r}: expected COUNTxGB, e.g. 1x80 or 2x24")
    return args


def assumed_gpus(spec: str) -> tuple[Gpu, ...]:
    count, gb = spec.split("x")
    mib = int(float(gb) * 1024)
    return tuple(Gpu(index=i, uuid=f"assumed-{i}", name="assumed", memory_total_mib=mib, memory_free_mib=mib)
                 for i in range(int(count)))


def measure_fit(box: BoxConfig, settings: Settings, assume: str | None) -> FitResult:
    problems: list[str] = []
    gpus: tuple[Gpu, ...] | None
    if assume:
        gpus = assumed_gpus(assume)
    else:
        try:
            gpus = probe_gpus()
        except ProbeError as exc:
            gpus = None
            problems.append(str(exc))
    disk = free_disk_gb(settings.hf_home)
    cached = {s.name: cached_weights_gb(settings.hf_home, s.model) for s in box.servers}
    # servers running unchanged keep their share of the card when the new set fits around them
    running = read_running(settings.conf_dir, box.servers)
    return check_fit(box.servers, gpus, disk, cached, tuple(problems), running)


def resolve_vllm(settings: Settings) -> Settings:
    """Write `vllm` as the absolute path this environment finds: supervisord's PATH may lack the
    image's virtualenv (Vast's images activate theirs only in login shells)."""
    found = shutil.which(settings.vllm_bin)
    if found and SAFE_PATH.match(found):
        return dataclasses.replace(settings, vllm_bin=found)
    return settings


def own_python() -> str:
    return sys.executable if sys.executable and SAFE_PATH.match(sys.executable) else "python3"


def render_units(box: BoxConfig, fit: FitResult, settings: Settings) -> list[Unit]:
    ports = {s.name: s.port for s in box.servers}
    return [render_unit(s, fit.placements[s.name], ports=ports, settings=settings, python=own_python(),
                        revision=box.revision, gpu_count=len(fit.gpus))
            for i, s in enumerate(box.servers)]


def save_applied(settings: Settings, body_sha256: str, poll_s: int) -> None:
    """What the box applied, for the box agent: it then applies only a config that differs."""
    write_atomic(settings.agent_state_path, json.dumps({"sha256": body_sha256, "poll_s": poll_s}) + "\n")


def show_dry_run(units: list[Unit], fit: FitResult, settings: Settings, gateway: GatewayPlan | None) -> None:
    keep = {u.path.name for u in units}
    for unit in units:
        print(f"# ==> {unit.path} (mode 0600) <==")
        print(unit.shown)
    if gateway is not None:
        print(f"# ==> {settings.gateway_config_path} (mode 0600) <==")
        print(gateway.config_text, end="")
        print(f"# gateway credentials in {settings.credentials_dir} (mode 0600): {', '.join(gateway.credentials)}")
        print(f"# gateway program: {settings.gateway_program_path}, run by {gateway.python}")
    print(f"# launcher: {settings.launcher_path} (mode 0700); logs: {settings.log_dir}; HF_HOME: {settings.hf_home}")
    for name in owned_units(settings.conf_dir):
        if name not in keep:
            print(f"# would remove {settings.conf_dir / name} (written by an earlier install, no longer named)")
    for problem in fit.problems:
        print(f"# fit problem: {problem}")


class Installer:
    """One run. Holds what the report needs as the steps go."""

    def __init__(self, args: argparse.Namespace, settings: Settings, *, client: Client | None = None,
                 fetched: bytes | None = None, agent: bool = False) -> None:
        """`fetched`: a box JSON the box agent already fetched with `client` (its GET is not repeated);
        `agent`: the box agent runs this install (its report says so unless the JSON drops the agent)."""
        self.args = args
        self.settings = settings
        self.client: Client | None = client
        self.fetched = fetched
        self.agent = agent  # the report's `agent`: the box agent runs on this box
        self.lock_wait_s = LOCK_WAIT_S
        self.retry = False  # the failure may pass (writing files, supervisord): the agent tries again
        self.busy = False  # another install held the lock
        self.stopping: Callable[[], bool] = lambda: False  # the agent's SIGTERM: stop waiting for a verdict
        self.body_sha256: str | None = None
        self.box: BoxConfig | None = None
        self.fit: FitResult | None = None
        self.states: dict[str, ServerState] = {}  # by server name, and "gateway" for the box gateway
        self.removed: tuple[str, ...] = ()

    def report(self, outcome: ReportOutcome, message: str) -> None:
        """POST /vllm/report. A failed report is logged and never changes the exit code."""
        if self.client is None:
            return
        body = build_report(revision=self.box.revision if self.box else "unknown", installer_version=__version__,
                            outcome=outcome, message=message, fit=self.fit,
                            servers=self.box.servers if self.box else (), states=self.states,
                            units_removed=self.removed, gateway=self.box.gateway if self.box else None,
                            agent=self.agent)
        try:
            self.client.send_report(body, deadline_s=min(REPORT_DEADLINE_S, self.settings.fetch_deadline_s),
                                    report_key=self.box.report_key if self.box else None)
            log(f"reported {outcome} to the control plane")
        except FetchError as exc:
            logs.log(f"could not report to the control plane (the install stands): {exc}", logging.WARNING)

    def fail(self, outcome: ReportOutcome, message: str) -> int:
        logs.log(message, logging.ERROR)
        self.report(outcome, message)
        return EXIT_FAILED

    def load_box(self) -> BoxConfig:
        settings = self.settings
        if self.args.config_file is not None:
            try:
                text = self.args.config_file.read_text(encoding="utf-8")
            except OSError as exc:
                raise BoxJsonError([f"cannot read {self.args.config_file}: {exc.strerror}"]) from None
            return parse_text(text, settings.host, source=str(self.args.config_file))
        if self.fetched is not None:
            data = self.fetched
        else:
            if not (settings.url and settings.fleet_key and settings.host):
                raise FetchError("no control plane settings")  # load() requires them without --config-file
            check_url(settings.url)
            self.client = Client(settings.url, settings.fleet_key, settings.host, settings.ca_bundle,
                                 deadline_s=settings.fetch_deadline_s,
                                 user_agent=f"fleetllm-installer/{__version__}", log=log)
            data = self.client.fetch_config()
        self.body_sha256 = hashlib.sha256(data).hexdigest()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise BoxJsonError(["GET /vllm/config answered bytes that are not UTF-8"]) from None
        return parse_text(text, settings.host, source="GET /vllm/config")

    def run(self) -> int:
        try:
            self.box = self.load_box()
        except FetchError as exc:
            logs.log(str(exc), logging.ERROR)  # the control plane is unusable, so there is no report to send
            return EXIT_FAILED
        except BoxJsonError as exc:
            return self.fail(ReportOutcome.FAILED, "the box JSON is not usable: " + "; ".join(exc.problems))
        box = self.box
        log(f"box {box.host} at revision {box.revision}: {len(box.servers)} server(s) "
            + ", ".join(f"{s.name}:{s.port}" for s in box.servers))
        self.fit = fit = measure_fit(box, self.settings, self.args.assume_gpus)
        try:
            units = render_units(box, fit, self.settings)
        except UnitError as exc:
            return self.fail(ReportOutcome.FAILED, f"cannot write a Supervisor program: {exc}")
        ours = {s.port for s in box.servers} | ({box.gateway.port} if box.gateway else set())
        clashes = []
        for name, ports in foreign_vllm_units(self.settings.conf_dir).items():
            path = self.settings.conf_dir / name
            if ports & ours:
                clashes.append(f"{path} (not written by fleetllm, so left in place) runs vLLM on port "
                               f"{', '.join(map(str, sorted(ports & ours)))}, which this box's servers use: "
                               "remove it and run the installer again")
            else:
                log(f"warning: {path} runs vLLM but was not written by fleetllm; left in place")
        if self.args.dry_run:
            for clash in clashes:
                log("would fail: " + clash)
            gateway = None
            try:
                gateway = self.plan_gateway(box)
            except BoxGatewayError as exc:
                log(f"would fail: {exc}")
            units += [gateway.unit] if gateway else []
            if box.agent is not None and self.client is not None:
                try:
                    units.append(plan_agent(self.settings, own_python())[0])
                except UnitError as exc:
                    log(f"would fail: cannot write the box agent's Supervisor program: {exc}")
            show_dry_run(units, fit, self.settings, gateway)
            self.states = {unit.server: ServerState.WRITTEN for unit in units}
            self.report(ReportOutcome.DRY_RUN, "dry run: nothing written")
            return EXIT_OK
        if not fit.ok and box.servers:  # a box JSON with no server (a retiring box) needs no GPU: it only removes
            self.retry = not fit.gpus  # nvidia-smi failed (a probe finds at least one GPU): it may pass
            return self.fail(ReportOutcome.FIT_FAILED, "will not fit: " + "; ".join(fit.problems))
        if clashes:
            return self.fail(ReportOutcome.FAILED, "; ".join(clashes))
        try:
            gateway = self.plan_gateway(box)
        except BoxGatewayError as exc:
            return self.fail(ReportOutcome.FAILED, str(exc))
        agent: tuple[Unit, bytes] | None = None
        if box.agent is not None:
            if self.client is None:
                log("the box JSON asks for the box agent: not installed with --config-file "
                    "(it needs the control plane)")
            else:
                try:
                    agent = plan_agent(self.settings, own_python())
                except UnitError as exc:
                    return self.fail(ReportOutcome.FAILED, f"cannot write the box agent's Supervisor program: {exc}")
        try:
            with install_lock(self.settings, self.lock_wait_s):
                return self.install(units, gateway, agent)
        except LockBusyError as exc:  # another install runs: the agent tries again soon, unreported
            self.retry = self.busy = True
            if self.agent:  # the agent logs that it looks again soon
                return EXIT_FAILED
            return self.fail(ReportOutcome.FAILED, str(exc))

    def settled_states(self, programs: list[str]) -> dict[str, str]:
        """Supervisor's verdict on each program: RUNNING once it stayed up `startsecs`, FATAL once it
        gave up (startretries starts that each ended sooner). Polled while a program is STARTING or in
        BACKOFF, at most until Supervisor must have decided, so that the report tells a server that
        crashes while loading from one that runs."""
        limit = self.settings.startsecs * (STARTRETRIES + 1) + SETTLE_MARGIN_S
        deadline = time.monotonic() + limit
        states = program_states(self.settings, programs)
        if any(states.get(p) in SETTLING for p in programs):
            log(f"waiting for supervisord's verdict on {len(programs)} program(s), at most {limit} s")
        while any(states.get(p) in SETTLING for p in programs) and time.monotonic() < deadline and not self.stopping():
            time.sleep(SETTLE_POLL_S)
            states = program_states(self.settings, programs)
        return states

    def plan_gateway(self, box: BoxConfig) -> GatewayPlan | None:
        """The box gateway's program and files, its config checked by the gateway itself (with its compiled
        modules, fetched first: not in a dry run, which writes nothing); None without one."""
        if box.gateway is None:
            return None
        client = None if self.args.dry_run else self.client
        plan = plan_gateway(box, box.gateway, self.settings, own_python(), client)
        verdict, plan = check_config(plan, self.settings)
        log(f"box gateway on port {box.gateway.port} (run by {plan.python}): {verdict}")
        if self.args.dry_run:
            log("dry run: the gateway's compiled modules are not fetched")
        else:
            log(plan.native_note if plan.native is not None else f"{plan.native_note}: the gateway runs its Python "
                "modules")
        return plan

    def update_programs(self, written: WriteResult) -> None:
        """Hand the written programs to supervisord (the box agent narrows this to leave itself alone)."""
        reread_and_update(self.settings)

    def install(self, units: list[Unit], gateway: GatewayPlan | None, agent: tuple[Unit, bytes] | None = None) -> int:
        assert self.box is not None
        if gateway is not None:
            units = [*units, gateway.unit]
        if agent is not None:
            units = [*units, agent[0]]
        try:
            if gateway is not None:
                write_gateway(self.settings, gateway)
            elif removed := remove_gateway(self.settings):
                log(f"no box gateway: removed {', '.join(p.name for p in removed)}")
            if agent is not None:
                write_agent(self.settings, agent[1])
            elif removed := remove_agent(self.settings):
                log(f"no box agent: removed {', '.join(p.name for p in removed)}")
            written = write_units(self.settings, units)
        except OSError as exc:
            self.retry = True
            return self.fail(ReportOutcome.FAILED, f"cannot write {exc.filename}: {exc.strerror}")
        except HandoverError as exc:
            self.retry = True
            return self.fail(ReportOutcome.FAILED, str(exc))
        self.agent = agent is not None
        self.removed = written.removed
        self.states = {unit.server: ServerState.WRITTEN for unit in units}
        log(f"wrote {len(units)} program(s) in {self.settings.conf_dir}"
            + (f"; removed {', '.join(written.removed)}" if written.removed else ""))
        handover = self.args.handover
        given_up: list[str] = []
        if handover == "update":
            try:
                self.update_programs(written)
                states = self.settled_states([u.program for u in units])
            except HandoverError as exc:
                self.retry = True
                return self.fail(ReportOutcome.FAILED, str(exc))
            self.states = {u.server: server_state(states.get(u.program)) for u in units}
            given_up = [f"{u.program} ({states.get(u.program, 'unknown to supervisord')})" for u in units
                        if self.states[u.server] is ServerState.FAILED]
        servers = len(self.box.servers)
        compiled = "" if gateway is None else " (compiled)" if gateway.native is not None else " (Python modules)"
        message = (f"{servers} server(s){' and the box gateway' + compiled if gateway else ''} handed to "
                   f"supervisord ({handover})")
        if given_up:
            message += "; supervisord gave up on " + ", ".join(given_up) + ": see their logs in " + str(
                self.settings.log_dir)
        self.report(ReportOutcome.INSTALLED, message)
        if agent is not None and self.body_sha256 is not None and self.box.agent is not None:
            try:
                save_applied(self.settings, self.body_sha256, self.box.agent.poll_s)
            except OSError as exc:
                log(f"cannot write {exc.filename}: {exc.strerror} (the box agent will apply this config once more)")
        if handover == "exec":
            log("exec supervisord -n")
            try:
                exec_supervisord(self.settings)
            except HandoverError as exc:
                logs.log(str(exc), logging.ERROR)
                return EXIT_FAILED
        log(message)
        return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        logs.setup(args, "fleetllm-installer")
    except ValueError as exc:
        print(f"fleetllm-installer: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        settings = load(need_control_plane=args.config_file is None)
    except SettingsError as exc:
        logs.log(str(exc), logging.ERROR)
        return EXIT_USAGE
    installer = Installer(args, resolve_vllm(settings))
    try:
        return installer.run()
    except Exception as exc:  # a bug: say so and report it, but no traceback (it may quote the box JSON)
        return installer.fail(ReportOutcome.FAILED, f"internal error in the installer ({type(exc).__name__}); "
                              "nothing more was done: please report this with the box's log")


if __name__ == "__main__":
    sys.exit(main())
