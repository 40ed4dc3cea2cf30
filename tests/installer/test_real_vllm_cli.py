"""Opt-in: the real vLLM CLI parser (from PyPI) accepts every command line the installer writes.

Skipped unless LLMFLEET_TEST_REAL_VLLM=1 in an environment with `vllm` installed (pip install vllm; the CPU
build is enough, nothing is loaded). Renders the example fleet's boxes through the real installer path
(box JSON -> fit -> Supervisor program), takes the vllm argv back out of the program's command with
shlex (as Supervisor does), and parses it with vLLM's own `serve` argument parser.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import pytest

from installer.boxjson import parse_box
from installer.fit import check_fit
from installer.hardware import Gpu
from installer.settings import load
from installer.units import render_unit
from reconciler.fleet.bearer import Salt
from reconciler.fleet.render import Bearers, render_all
from reconciler.fleet.source import read_directory
from reconciler.fleet.validate import validate_snapshot
from tests.conftest import EXAMPLE, TEST_LEGACY_KEY, TEST_SALT

pytestmark = pytest.mark.skipif(os.environ.get("LLMFLEET_TEST_REAL_VLLM") != "1",
                                reason="set LLMFLEET_TEST_REAL_VLLM=1 with vllm installed to run")


def vllm_parser() -> Any:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    try:
        from vllm.utils import FlexibleArgumentParser
    except ImportError:  # newer vLLM moved it
        from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[no-redef]
    return make_arg_parser(FlexibleArgumentParser())


def rendered_argvs(tmp_path: Path) -> list[list[str]]:
    validation = validate_snapshot(read_directory(EXAMPLE))
    assert validation.fleet is not None
    settings = load({"LLMFLEET_DATA_DIR": str(tmp_path)}, need_control_plane=False)
    gpus = (Gpu(0, "GPU-0", "H100", 81559, 81559),)
    argvs = []
    for name, document in render_all(validation.fleet, Bearers(Salt(TEST_SALT), TEST_LEGACY_KEY)).items():
        box = parse_box(document, name)
        fit = check_fit(box.servers, gpus, disk_free_gb=None)
        ports = {s.name: s.port for s in box.servers}
        for server in box.servers:
            unit = render_unit(server, fit.placements[server.name], order=0, ports=ports, settings=settings,
                               python="python3", revision=box.revision, gpu_count=1)
            command = next(line for line in unit.text.splitlines() if line.startswith("command="))
            argv = shlex.split(command.removeprefix("command=").replace("%%", "%"))
            argvs.append(argv[argv.index("--") + 1:])
    return argvs


def test_every_rendered_command_line_parses(tmp_path: Path) -> None:
    parser = vllm_parser()
    argvs = rendered_argvs(tmp_path)
    assert len(argvs) == 7
    for argv in argvs:
        assert argv[1] == "serve"
        args = parser.parse_args(["--model", argv[2], *argv[3:]])
        assert args.model == argv[2]
        assert args.port == int(argv[argv.index("--port") + 1])
        assert args.served_model_name == [argv[argv.index("--served-model-name") + 1]]
        assert args.api_key is None  # the bearer comes from VLLM_API_KEY, never the command line
