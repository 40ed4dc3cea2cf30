"""`fleetllm demo`: a whole fleet on this machine. See fleetllm.demo and docs/quickstart.md."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import fleetllm
from fleetllm.cli.common import CommandError

SCENARIOS = ("move-model", "move-single", "bad-boot", "rollouts", "retire-box",  # fleetllm.demo.scenario.SCENARIOS
             "empty-box", "rent-box")

DESCRIPTION = """\
Run a whole fleet locally: the example fleet repository in a scratch git repository with every box
simulated on its own loopback address (127.0.0.2, 127.0.0.3, ...; no GPU: vLLM is a stub that speaks
its HTTP API), the control plane (fleetllm serve), each box booted by its provisioning script and the
real installer under its own supervisord, and the reconciler judging every server and converging
LiteLLM (or planning only, without one). Ctrl-C stops every process it started."""

EPILOG = """\
environment:
  LITELLM_MASTER_KEY       the master key of the proxy given with --litellm-url
  FLEETLLM_DEMO_LITELLM=1  build a LiteLLM proxy with PostgreSQL for the run (../shared/litellm-offline,
                           as CI does; about two minutes, needs root)
exit status: 0 done (or Ctrl-C, without --once), 1 the demo failed or, with --once, the final state is wrong"""


def _example() -> Path:
    package = Path(fleetllm.__file__).resolve().parent
    packaged = package / "_fleet_example"
    return packaged if packaged.is_dir() else package.parents[1] / "fleet-repo-example"


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=SCENARIOS,
                        help="once the fleet serves, commit a change and let the rollout play it out (no manual "
                             "step) under load through LiteLLM: move-model moves a server to a free port of "
                             "another box, move-single moves the only server of a model, bad-boot commits a "
                             "recipe vLLM refuses (the rollout halts and rolls back; a revert converges), "
                             "rollouts plays all three; retire-box removes a box (drained, emptied, retired) and "
                             "empty-box moves the only server of a box away, each then a recipe change; rent-box "
                             "declares capacity in fleet.yaml and a simulated RunPod rents a box for it (booted, "
                             "approved, serving), then releases it (retired, terminated)")
    parser.add_argument("--once", action="store_true",
                        help="run to the end without a live display and exit 0 only if the final state is right")
    parser.add_argument("--litellm-url", metavar="URL", help="a running LiteLLM proxy (with a database) to converge")
    parser.add_argument("--litellm-master-key-file", metavar="FILE", type=Path,
                        help="its master key (default: LITELLM_MASTER_KEY from the environment)")
    parser.add_argument("--litellm-harness", metavar="DIR", type=Path,
                        help="the offline LiteLLM harness for FLEETLLM_DEMO_LITELLM=1 (default: "
                             "../shared/litellm-offline beside the project)")
    parser.add_argument("--first-address", default="127.0.0.2", metavar="ADDR",
                        help="the first simulated box's address; the others follow (default: 127.0.0.2)")
    parser.add_argument("--workdir", metavar="DIR", type=Path,
                        help="the scratch directory (new or empty; kept afterwards). Default: a new one in /tmp, "
                             "removed at the end")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, repository) afterwards")
    parser.add_argument("--example", metavar="DIR", type=Path, default=None,
                        help="the fleet repository to simulate (default: fleet-repo-example)")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                        help="how long the fleet may take to converge, per step (default: 300; 900 with --real-vllm)")
    parser.add_argument("--real-vllm", action="store_true",
                        help="add one box of two REAL vLLM servers (vLLM's CPU build serving a tiny random Llama, "
                             "tools/vllm-cpu/setup.sh builds it) beside the simulated ones: ~2 min more to "
                             "converge, ~4 GB of memory")
    parser.add_argument("--vllm-harness", metavar="PREFIX", type=Path,
                        help="the real vLLM harness for --real-vllm (default: $FLEETLLM_VLLM_PREFIX, else a finished "
                             "harness in vllm-cpu/ beside the checkout, else ~/.cache/fleetllm/vllm-cpu)")
    parser.add_argument("--build-vllm-harness", action="store_true",
                        help="with --real-vllm: build the harness first if it is not there (3.5-5.5 min, 3.4 GB)")
    parser.add_argument("--forge-api-url", metavar="URL",
                        help="a GitHub REST API (https://api.github.com, or a fake on loopback) where each rollout "
                             "sets its commit's status (pending, success, failure): the control plane's forge "
                             "section; with --forge-repository and --forge-token-file")
    parser.add_argument("--forge-repository", metavar="OWNER/NAME", help="the repository the statuses are set on")
    parser.add_argument("--forge-token-file", metavar="FILE", type=Path,
                        help="a file holding a token that may write its commit statuses (read by reference)")
    parser.set_defaults(run=run)


def _forge(args: argparse.Namespace) -> Any:
    given = [args.forge_api_url, args.forge_repository, args.forge_token_file]
    if not any(given):
        return None
    if not all(given):
        raise CommandError("--forge-api-url, --forge-repository and --forge-token-file go together")
    token: Path = args.forge_token_file
    if not token.is_file():
        raise CommandError(f"--forge-token-file {token}: no such file")
    from fleetllm.demo.workspace import DemoForge

    return DemoForge(args.forge_api_url.rstrip("/"), args.forge_repository, token.resolve())


def _master_key(args: argparse.Namespace) -> str | None:
    path: Path | None = args.litellm_master_key_file
    if path is not None:
        try:
            return path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise CommandError(f"--litellm-master-key-file {args.litellm_master_key_file}: {exc.strerror}") from None
    key = os.environ.get("LITELLM_MASTER_KEY", "").strip()
    return key or None


SUPERVISOR_MISSING = ("fleetllm demo runs a real supervisord per simulated box, and the supervisor package is not "
                      "installed beside fleetllm: pip install 'supervisor>=4.2' (or pip install 'fleetllm[demo]'; "
                      "`make demo` installs everything)")


def run(args: argparse.Namespace) -> int:
    import importlib.util

    if importlib.util.find_spec("supervisor") is None:  # a --no-deps install: say what to install, no traceback
        raise CommandError(SUPERVISOR_MISSING, 1)
    from rich.console import Console

    from fleetllm.demo.litellm import find_harness
    from fleetllm.demo.run import Demo, Options

    build = os.environ.get("FLEETLLM_DEMO_LITELLM", "").strip() not in ("", "0")
    if build and args.litellm_url:
        raise CommandError("give --litellm-url or FLEETLLM_DEMO_LITELLM=1, not both")
    if (args.vllm_harness or args.build_vllm_harness) and not args.real_vllm:
        raise CommandError("--vllm-harness and --build-vllm-harness go with --real-vllm")
    console = Console(highlight=False)
    if not console.is_terminal:  # a log or a pipe: wide enough for the table and the paths
        console = Console(highlight=False, width=200)
    harness = None
    if args.real_vllm:
        from fleetllm.demo import realvllm
        from fleetllm.demo.fleet import DemoError

        if args.build_vllm_harness:
            console.print("building the real vLLM harness if needed (3.5-5.5 min the first time) ...")
        try:
            harness = realvllm.locate(args.vllm_harness, build=args.build_vllm_harness, setup=realvllm.find_setup())
        except DemoError as exc:
            raise CommandError(str(exc)) from None
        console.print(f"real vLLM harness: {harness.prefix}", highlight=False)
    timeout = max(args.timeout, 900.0) if harness is not None else args.timeout
    options = Options(example=args.example or _example(), scenario=args.scenario, once=args.once,
                      workdir=args.workdir, keep=args.keep, first_address=args.first_address,
                      litellm_url=args.litellm_url, litellm_master_key=_master_key(args), build_litellm=build,
                      litellm_harness=args.litellm_harness or find_harness(), timeout_s=timeout,
                      real_vllm=harness, forge=_forge(args))
    return Demo(options, console).run()
