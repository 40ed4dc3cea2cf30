"""Opt-in: the real vLLM CLI parser (from PyPI) accepts every command line the installer writes.

Skipped unless LLMFLEET_TEST_REAL_VLLM=1 in an environment with `vllm` installed (pip install vllm; nothing is
loaded and no GPU is needed). Renders the example fleet's boxes through the real installer path
(box JSON -> fit -> Supervisor program), takes the vllm argv back out of the program's command with
shlex (as Supervisor does), and parses it with vLLM's own `serve` argument parser.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import pytest

from llmfleet.adapters.git import read_directory
from llmfleet.core.fleet.bearer import Salt
from llmfleet.core.fleet.render import Bearers, render_all
from llmfleet.core.fleet.validate import validate_snapshot
from llmfleet_installer.boxjson import parse_box
from llmfleet_installer.fit import check_fit
from llmfleet_installer.hardware import Gpu
from llmfleet_installer.settings import load
from llmfleet_installer.units import render_unit
from tests.conftest import EXAMPLE, TEST_LEGACY_KEY, TEST_SALT

pytestmark = pytest.mark.skipif(os.environ.get("LLMFLEET_TEST_REAL_VLLM") != "1",
                                reason="set LLMFLEET_TEST_REAL_VLLM=1 with vllm installed to run")


def vllm_serve() -> tuple[Any, Any]:
    """vLLM's own top-level parser with its `serve` subcommand, built as `vllm` builds it."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older vLLM
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef,attr-defined]
    parser = FlexibleArgumentParser(prog="vllm")
    serve = ServeSubcommand()
    serve.subparser_init(parser.add_subparsers(required=False, dest="subparser"))
    return parser, serve


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


def test_every_rendered_command_line_parses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not os.environ.get("VLLM_TARGET_DEVICE"):
        monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")  # no GPU here: building the parser needs a platform
    parser, serve = vllm_serve()
    argvs = rendered_argvs(tmp_path)
    assert len(argvs) == 7
    for argv in argvs:
        args = parser.parse_args(argv[1:])  # what `vllm` parses: everything after the program name
        serve.validate(args)
        assert args.subparser == "serve"
        assert args.model_tag == argv[2]
        assert args.port == int(argv[argv.index("--port") + 1])
        assert args.host == argv[argv.index("--host") + 1]
        assert args.served_model_name == [argv[argv.index("--served-model-name") + 1]]
        assert args.max_model_len == int(argv[argv.index("--max-model-len") + 1])
        if "--gpu-memory-utilization" in argv:
            assert args.gpu_memory_utilization == float(argv[argv.index("--gpu-memory-utilization") + 1])
        assert args.api_key is None  # the bearer comes from VLLM_API_KEY, never the command line
