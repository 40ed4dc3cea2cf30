"""The command lines the installer writes for the example fleet: its boxes rendered through the real
installer path (box JSON -> fit -> Supervisor program), each vllm argv taken back out of the program's
command with shlex, as Supervisor splits it. tests/realvllm parses them with vLLM's own parser."""

from __future__ import annotations

import shlex
from pathlib import Path

from fleetllm.adapters.git import read_directory
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.render import Bearers, render_all
from fleetllm.core.fleet.validate import validate_snapshot
from fleetllm_installer.boxjson import parse_box
from fleetllm_installer.fit import check_fit
from fleetllm_installer.hardware import Gpu
from fleetllm_installer.settings import load
from fleetllm_installer.units import render_unit
from tests.conftest import EXAMPLE, TEST_LEGACY_KEY, TEST_SALT


def rendered_argvs(tmp_path: Path) -> list[list[str]]:
    validation = validate_snapshot(read_directory(EXAMPLE))
    assert validation.fleet is not None
    settings = load({"FLEETLLM_DATA_DIR": str(tmp_path)}, need_control_plane=False)
    gpus = (Gpu(0, "GPU-0", "H100", 81559, 81559),)
    argvs = []
    for name, document in render_all(validation.fleet, Bearers(Salt(TEST_SALT), TEST_LEGACY_KEY)).items():
        box = parse_box(document, name)
        fit = check_fit(box.servers, gpus, disk_free_gb=None)
        ports = {s.name: s.port for s in box.servers}
        for server in box.servers:
            unit = render_unit(server, fit.placements[server.name], ports=ports, settings=settings,
                               python="python3", revision=box.revision, gpu_count=1)
            command = next(line for line in unit.text.splitlines() if line.startswith("command="))
            argv = shlex.split(command.removeprefix("command=").replace("%%", "%"))
            argvs.append(argv[argv.index("--") + 1:])
    return argvs
