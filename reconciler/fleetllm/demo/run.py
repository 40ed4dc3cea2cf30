"""`fleetllm demo`: set up a simulated fleet, show it converge (live, or --once to the end), and stop
every process it started.

Set-up: the example fleet rewritten for loopback boxes (fleet.py) in a scratch git repository;
secrets generated for the run (workspace.py); LiteLLM given or built (litellm.py); `fleetllm serve`
(controlplane.py); each box booted by its provisioning script (boxes.py). Then reconcile passes every
few seconds, each the one `fleetllm reconcile` runs (reconciler.py: the job's PassRunner, its log in
<scratch>/control-plane/reconcile.log), shown as a table (view.py), the scenario (scenario.py), and the
final checks (check.py). Shutdown runs on every exit path, Ctrl-C included.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

from rich.console import Console
from rich.live import Live

from fleetllm.adapters.git import read_directory
from fleetllm.adapters.state import open_store
from fleetllm.adapters.state.sqlstore import SqlStateStore
from fleetllm.demo import procs, realvllm
from fleetllm.demo.boxes import SimulatedBox
from fleetllm.demo.check import problems, waiting_for
from fleetllm.demo.controlplane import ControlPlane
from fleetllm.demo.fleet import REAL_MODELS, DemoError, binds, simulate, with_real_box
from fleetllm.demo.follow import follow
from fleetllm.demo.guide import banner, where_to_look
from fleetllm.demo.litellm import Litellm, build, check_shared, remove_demo_deployments
from fleetllm.demo.move import Move
from fleetllm.demo.reconciler import reconciler
from fleetllm.demo.rentals import Rentals
from fleetllm.demo.scenario import Results, run_scenarios
from fleetllm.demo.view import BoxStates, screen, written
from fleetllm.demo.workspace import DemoForge, Workspace, control_plane_config, create, init_fleet_repo
from fleetllm.job.engine import PassOutcome
from fleetllm.job.runner import PassRunner
from fleetllm.logs import LOGGER, setup_logging


@dataclass(frozen=True)
class Options:
    example: Path
    scenario: str | None = None
    once: bool = False
    workdir: Path | None = None
    keep: bool = False
    first_address: str = "127.0.0.2"
    litellm_url: str | None = None
    litellm_master_key: str | None = field(default=None, repr=False)
    build_litellm: bool = False
    litellm_harness: Path | None = None
    interval_s: float = 2.0
    timeout_s: float = 300.0
    real_vllm: realvllm.Harness | None = None  # one more box, of two real vLLM servers (--real-vllm)
    forge: DemoForge | None = None  # where the rollouts set commit statuses (--forge-api-url ...)


NO_HARNESS = (
    "no LiteLLM harness found: FLEETLLM_DEMO_LITELLM=1 (`make demo-litellm`) builds LiteLLM with the offline "
    "harness, a folder with setup.sh that is not part of this repository (the project keeps it in shared/"
    "litellm-offline beside its checkouts, where it is looked for in ../shared/litellm-offline and further up). "
    "Pass its folder with --litellm-harness DIR (make demo-litellm DEMO_ARGS=\"--litellm-harness DIR\"), or run "
    "a LiteLLM proxy of your own and pass --litellm-url URL with LITELLM_MASTER_KEY set; without either, "
    "`make demo` runs without LiteLLM (the boxes route)")


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    procs.stop_asked.set()  # for when this KeyboardInterrupt is lost in a finalizer: procs.pause raises it again
    raise KeyboardInterrupt  # every stop signal goes through the shutdown, as Ctrl-C does


def _stop_signals() -> list[signal.Signals]:
    """SIGINT (even when a shell started the demo in the background, which ignores it), SIGTERM, and
    SIGHUP (the terminal closed) unless nohup asked to ignore it."""
    ignored_hup = signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    return [signal.SIGINT, signal.SIGTERM, *([] if ignored_hup else [signal.SIGHUP])]


class Demo:
    def __init__(self, options: Options, console: Console) -> None:
        self.options = options
        self.console = console
        self.workspace: Workspace | None = None
        self.litellm: Litellm | None = None
        self.control_plane: ControlPlane | None = None
        self.boxes: dict[str, SimulatedBox] = {}
        self.runner: PassRunner | None = None  # the shipped reconcile pass (reconciler.py)
        self.store: SqlStateStore | None = None  # the control plane's state store, for the demo's own checks
        self.last: PassOutcome | None = None  # the last pass that ran
        self.log: IO[str] | None = None  # this process's log while the demo runs: <scratch>/control-plane/reconcile.log
        self.live: Live | None = None
        self.header: list[str] = []
        self.real: tuple[str, ...] = ()  # the boxes of real vLLM servers (--real-vllm), named in the table's title
        self.verdicts: dict[tuple[str, int], str] = {}
        self.move: Move | None = None
        self.results: Results | None = None  # the rollout scenarios played
        self.first_model = ""  # the model the printed curl asks for
        self.reported_invalid: str | None = None
        self.owned: set[str] = set()  # every box name the demo simulated: its deployments are the demo's
        self.rentals: Rentals | None = None  # the simulated RunPod of the rent-box scenario

    # -- output ------------------------------------------------------------------------------------
    def say(self, message: str, style: str = "") -> None:
        self.console.print(message, style=style, highlight=False, markup=False, soft_wrap=True)

    @property
    def applying(self) -> bool:
        return self.litellm is not None

    def states(self) -> BoxStates:
        return {name: box.states() for name, box in self.boxes.items()}

    def redraw(self, outcome: PassOutcome | None, note: str = "") -> None:
        if self.live is not None:
            self.live.update(screen(self.header, outcome, self.states(), applying=self.applying, note=note,
                                    real=self.real))

    # -- set-up --------------------------------------------------------------------------------------
    def set_up(self) -> None:
        options = self.options
        if not (Path(sys.executable).parent / "supervisord").exists():
            raise DemoError("fleetllm demo runs a real supervisord per box: install it beside fleetllm "
                            "(pip install 'fleetllm[demo]', or `make demo`, which does)")
        if shutil.which("git") is None:
            raise DemoError("fleetllm demo needs git on PATH")
        demo_fleet = simulate(read_directory(options.example), options.first_address)
        if options.real_vllm is not None:
            demo_fleet = with_real_box(demo_fleet, str(options.real_vllm.model), options.first_address,
                                       max_model_len=realvllm.MODEL_LEN, kv_cache_bytes=realvllm.KV_CACHE_BYTES,
                                       max_num_seqs=realvllm.MAX_NUM_SEQS)
        fleet = demo_fleet.fleet
        self.real = tuple(box.name for box in demo_fleet.boxes if box.real_vllm)
        self.first_model = next(row.model for box in fleet.boxes.values() for row in box.servers)
        for address, port in binds(fleet):
            if not procs.can_bind(address, port):
                raise DemoError(f"{address}:{port} is taken (another fleetllm demo?): stop it, or pass "
                                "--first-address 127.0.1.2 to simulate the boxes elsewhere in 127.0.0.0/8")
        self.workspace = workspace = create(options.workdir)
        # From here this process's own log (the reconciler's passes, the LiteLLM and forge clients, the notifier)
        # goes to a file beside serve.log, never across the set-up lines or the live display.
        self.log = (workspace.control_plane / "reconcile.log").open("a", encoding="utf-8")
        setup_logging(self.log, level=logging.getLogger(LOGGER).level)
        self.say(f"scratch directory {workspace.root}")
        for line in demo_fleet.dropped:
            self.say(f"left out of the demo: {line}", "yellow")
        revision = init_fleet_repo(workspace, demo_fleet.files)
        self.say(f"fleet repository {workspace.fleet} at {revision[:12]}: " + ", ".join(
            f"{b.example_name} -> {b.name}" for b in demo_fleet.boxes))
        self.litellm = self._litellm(workspace, [b.name for b in demo_fleet.boxes])
        port = procs.free_port()
        if options.scenario == "rent-box":
            self.rentals = Rentals(options.first_address)
            workspace.write_secret("runpod-api-key", self.rentals.api_key)
            self.say(f"simulated RunPod (its pod API, in this process) at {self.rentals.start()}: the control plane's "
                     "providers.runpod")
        control_plane_config(workspace, port, self.litellm.url if self.litellm else None, options.forge,
                             self.rentals.url if self.rentals is not None else None)
        if options.forge is not None:
            self.say(f"commit statuses: each rollout sets its commit's status on {options.forge.repository} at "
                     f"{options.forge.api_url} (forge in the control plane's config)")
        self.control_plane = plane = ControlPlane(workspace, port)
        plane.start()
        self.say(f"control plane (fleetllm serve) on {plane.url}, serving {revision[:12]}")
        for sim in demo_fleet.boxes:
            box = self.boxes[sim.name] = SimulatedBox(sim, workspace.boxes / sim.name,
                                                      workspace.sockets / f"{sim.name}.sock", workspace.tag,
                                                      options.real_vllm)
            self.owned.add(sim.name)
            box.prepare(fleet)
            self.provision(box, f"boots ({sim.template} template, was {sim.example_name})")
        self.store = open_store(workspace.state_url, application_name="fleetllm-demo")
        self.runner = reconciler(workspace, self.litellm, rollouts=options.scenario is not None)

    def _litellm(self, workspace: Workspace, boxes: list[str]) -> Litellm | None:
        options = self.options
        if options.litellm_url:
            if not options.litellm_master_key:
                raise DemoError("--litellm-url needs the proxy's master key: LITELLM_MASTER_KEY in the environment "
                                "or --litellm-master-key-file FILE")
            litellm = Litellm(options.litellm_url.rstrip("/"), options.litellm_master_key)
            check_shared(litellm, boxes)
        elif options.build_litellm:
            if options.litellm_harness is None:
                raise DemoError(NO_HARNESS)
            litellm = build(workspace, options.litellm_harness, workspace.secret("litellm-master-key"), self.say)
        else:
            self.say("no LiteLLM: the boxes route, and commits roll out box by box without it (pass --litellm-url, "
                     "or set FLEETLLM_DEMO_LITELLM=1 "
                     "to build one)", "yellow")
            return None
        workspace.write_secret("litellm-master-key", litellm.master_key)
        workspace.write_secret("litellm-auth.header", f"Authorization: Bearer {litellm.master_key}\n")
        self.say(f"LiteLLM proxy at {litellm.url}")
        return litellm

    def provision(self, box: SimulatedBox, what: str) -> None:
        assert self.control_plane is not None
        assert self.workspace is not None
        done = box.provision(self.control_plane.url, self.workspace.secret("fleet-key"))
        self.say(f"box {box.name} {what}: " + ("installer done" if done.ok else "installer FAILED"),
                 "" if done.ok else "red")
        if not done.ok:
            self.say(done.log, "red")

    # -- passes --------------------------------------------------------------------------------------
    def tick(self, note: str = "") -> PassOutcome | None:
        """One pass of the reconcile job (PassRunner.scheduled_pass), then what it found, said."""
        assert self.runner is not None
        if self.rentals is not None:  # boot what the provider rented since the last pass, stop what it terminated
            self.rentals.step(self)
        outcome = asyncio.run(self.runner.scheduled_pass())
        invalid = self.runner.invalid_head
        if invalid is not None and invalid.revision != self.reported_invalid:
            self.say(f"commit {invalid.revision[:12]} on main is not valid, so nothing serves it: the control plane "
                     f"and the reconciler keep {invalid.serving[:12]}. Fix it with a new commit:\n"
                     + "\n".join(invalid.errors), "yellow")
        self.reported_invalid = invalid.revision if invalid is not None else None
        if outcome is None:
            self.say("pass skipped: another reconcile pass holds the lock", "yellow")
            return self.last
        self.last = outcome
        for key, server in sorted(outcome.intended.servers.items()):
            verdict = str(outcome.plan.judgements[key].verdict)
            before = self.verdicts.get(key)
            if before != verdict:
                self.say(f"  {server.box}:{server.port} {server.model}: {before or 'new'} -> {verdict}")
            self.verdicts[key] = verdict
        for gone in set(self.verdicts) - set(outcome.intended.servers):
            self.say(f"  {gone[0]}:{gone[1]}: no longer in the repository")
            del self.verdicts[gone]
        for line, style in written(outcome.results):
            self.say(line, style)
        self.redraw(outcome, note)
        return outcome

    def converge(self, what: str) -> PassOutcome | None:
        """Passes until the fleet is where it should be."""
        return self.wait(what, lambda outcome: waiting_for(outcome, applying=self.applying))

    def wait(self, what: str, missing: Callable[[PassOutcome], list[str]]) -> PassOutcome | None:
        """Passes until `missing` finds nothing missing; at the timeout, --once fails (DemoError), the
        live demo says what it still waits for and goes on."""
        deadline = time.monotonic() + self.options.timeout_s
        self.say(what)
        while True:
            outcome = self.tick()
            waiting = missing(outcome) if outcome is not None else ["a first pass"]
            if not waiting:
                return outcome
            if time.monotonic() > deadline:
                if self.options.once:
                    raise DemoError(f"not done after {self.options.timeout_s:g} s: " + "; ".join(waiting))
                self.say("still waiting for: " + "; ".join(waiting[:4]), "yellow")
                deadline = time.monotonic() + self.options.timeout_s
            procs.pause(self.options.interval_s)

    # -- the whole run -------------------------------------------------------------------------------
    def run(self) -> int:
        procs.stop_asked.clear()
        previous = {sig: signal.signal(sig, _interrupt) for sig in _stop_signals()}
        code = 1
        try:
            self.set_up()
            assert self.workspace is not None
            assert self.control_plane is not None
            for line in where_to_look(self.workspace, self.control_plane.url, self.litellm, self.first_model):
                self.say(line)
            self.header = banner(len(self.boxes), self.control_plane.url, self.litellm)
            code = self.run_once() if self.options.once else self.run_live()
        except KeyboardInterrupt:
            self.say("\nstopping the demo (Ctrl-C or a stop signal)")
            code = 130 if self.options.once else 0
        except DemoError as exc:
            self.say(f"fleetllm demo: {exc}", "red")
        finally:
            self.shut_down()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return code

    def scenario(self) -> None:
        if self.options.scenario is None:
            return
        self.results = run_scenarios(self, self.options.scenario, self.litellm, timeout_s=self.options.timeout_s,
                                     interval_s=self.options.interval_s, rentals=self.rentals)
        self.move = self.results.move

    def run_once(self) -> int:
        self.converge("waiting for every simulated server to serve" + (" and LiteLLM to follow" if self.applying
                                                                      else ""))
        self.scenario()
        outcome = self.tick()
        self.console.print(screen([], outcome, self.states(), applying=self.applying, real=self.real))
        found = problems(outcome, self.states(), self.move, applying=self.applying)
        found += self.results.problems if self.results is not None else []
        if self.litellm is not None and outcome is not None and not found:
            model = self.move.model if self.move else next(iter(outcome.intended.servers.values())).model
            answer = self.litellm.chat(model, "hello")
            self.say(f"chat completion through LiteLLM to {model}: {answer!r}")
            if not answer.startswith(f"stub-vllm {model} "):  # the simulated vLLM names itself in its answers
                found.append(f"LiteLLM's answer for {model} did not come from a simulated server of it")
            if self.options.real_vllm is not None:
                for real in REAL_MODELS:
                    text = self.litellm.chat(real, "hello", max_tokens=8)
                    self.say(f"chat completion through LiteLLM to the real vLLM {real}: {text!r}")
        for problem in found:
            self.say(f"wrong: {problem}", "red")
        self.say("final state: " + ("as expected" if not found else f"{len(found)} problem(s)"),
                 "green" if not found else "red")
        return 0 if not found else 1

    def run_live(self) -> int:
        with Live(screen(self.header, None, self.states(), applying=self.applying, real=self.real),
                  console=self.console, refresh_per_second=2) as live:
            self.live = live
            self.converge("waiting for every simulated server to serve (Ctrl-C stops the demo)")
            self.scenario()
            assert self.runner is not None
            followed = self.runner.fleet
            while True:
                self.tick(note="Edit placement.yaml in the fleet repository and commit: the demo restarts the boxes "
                               "it touches. Ctrl-C stops the demo.")
                followed = follow(self, followed)
                procs.pause(self.options.interval_s)

    # -- shutdown ------------------------------------------------------------------------------------
    def shut_down(self) -> None:
        for sig in _stop_signals():  # a second Ctrl-C must not cut the cleanup short
            signal.signal(sig, signal.SIG_IGN)
        self._stop_all()

    def _stop_all(self) -> None:
        if self.runner is not None:
            self.runner.close()
        if self.store is not None:
            self.store.close()
        if self.log is not None:  # this process logs on stderr again
            setup_logging(level=logging.getLogger(LOGGER).level)
            self.log.close()
        if self.litellm is not None and self.litellm.prefix is None:
            try:
                removed = remove_demo_deployments(self.litellm, self.owned)
                self.say(f"removed the demo's {removed} deployment(s) from LiteLLM at {self.litellm.url}")
            except Exception as exc:  # the shutdown goes on; say what is left
                self.say(f"could not remove the demo's deployments from {self.litellm.url}: {exc}", "red")
        for box in self.boxes.values():
            box.stop()
        if self.rentals is not None:
            self.rentals.stop()
        if self.control_plane is not None:
            self.control_plane.stop()
        if self.litellm is not None:
            self.litellm.stop()
        if self.workspace is None:
            return
        root = self.workspace.root
        leftovers = procs.sweep(self.workspace.tag)
        if leftovers:
            self.say(f"stopped {len(leftovers)} process(es) that outlived their shutdown: {leftovers}", "yellow")
        if not self.workspace.sockets.is_relative_to(root):
            shutil.rmtree(self.workspace.sockets, ignore_errors=True)
        if self.options.keep or self.options.workdir is not None:
            self.say(f"stopped; the scratch directory stays: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
            self.say("stopped every process; scratch directory removed")
