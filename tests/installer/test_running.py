"""A re-install keeps what runs: the programs read back (running.py) and the stable placement and division
(fit.py with `running`), so that a steady server's program is byte-identical and Supervisor leaves it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from fleetllm_installer.boxjson import ServerSpec, parse_box
from fleetllm_installer.fit import Running, check_fit
from fleetllm_installer.handover import write_units
from fleetllm_installer.hardware import Gpu
from fleetllm_installer.launcher import PRESENT, present_servers
from fleetllm_installer.running import read_running
from fleetllm_installer.settings import Settings, load
from fleetllm_installer.units import Unit, render_unit
from tests.installer.conftest import BOX


def gpu(index: int = 0, gb: float = 80) -> Gpu:
    mib = int(gb * 1024)
    return Gpu(index=index, uuid=f"GPU-{index}", name="A100", memory_total_mib=mib, memory_free_mib=mib)


def server(name: str, vram: float, port: int, *, digest: str = "", args: tuple[str, ...] = ()) -> ServerSpec:
    return ServerSpec(name=name, model=f"org/{name}", served_model_name=name, port=port, api_key="sk-vllm-testtest",
                      args=args, vram_gb=vram, digest=digest or f"sha256:{name}")


def settings_in(tmp_path: Path) -> Settings:
    return load({"FLEETLLM_DATA_DIR": str(tmp_path / "data"), "FLEETLLM_SUPERVISOR_CONF_DIR": str(tmp_path / "conf")},
                need_control_plane=False)


def install(tmp_path: Path, servers: tuple[ServerSpec, ...], gpus: tuple[Gpu, ...]) -> dict[str, Unit]:
    """What the installer does up to the hand-over: read what runs, fit, render, write."""
    settings = settings_in(tmp_path)
    fit = check_fit(servers, gpus, None, running=read_running(settings.conf_dir, servers))
    assert fit.ok, fit.problems
    ports = {s.name: s.port for s in servers}
    units = [render_unit(s, fit.placements[s.name], ports=ports, settings=settings, python="python3",
                         revision="r", gpu_count=len(gpus)) for s in servers]
    write_units(settings, units)
    return {u.server: u for u in units}


def test_a_server_added_where_it_fits_leaves_the_running_programs_byte_identical(tmp_path: Path) -> None:
    a, b, c = server("a", 10, 8001), server("b", 30, 8002), server("c", 10, 8003)
    first = install(tmp_path, (a, b), (gpu(),))
    install(tmp_path, (a,), (gpu(),))  # b leaves: a keeps everything, even its --after b (the launcher skips it)
    third = install(tmp_path, (c, a), (gpu(),))  # c arrives first in the JSON, and sorts before nothing
    assert third["a"].text == first["a"].text
    assert "--gpu-memory-utilization 0.325" in first["a"].text
    assert "--after a=8001" in third["c"].text  # a new server boots after the ones that run
    assert "priority=100" in third["c"].text and "priority=100" in third["a"].text  # one priority: the launcher orders
    assert present_servers(settings_in(tmp_path).launcher_path.parent / PRESENT) == {("a", 8001), ("c", 8003)}


def test_a_server_that_does_not_fit_redivides_and_changes_the_neighbours_program(tmp_path: Path) -> None:
    a, b = server("a", 10, 8001), server("b", 30, 8002)
    alone = install(tmp_path, (a,), (gpu(),))
    both = install(tmp_path, (a, b), (gpu(),))
    assert re.search(r"--gpu-memory-utilization 0\.9(\s|$)", alone["a"].text, re.MULTILINE)
    assert both["a"].text != alone["a"].text
    assert "--gpu-memory-utilization 0.325" in both["a"].text


def test_a_changed_digest_or_bearer_is_not_kept(tmp_path: Path) -> None:
    a, b = server("a", 10, 8001), server("b", 30, 8002)
    install(tmp_path, (a, b), (gpu(),))
    conf = settings_in(tmp_path).conf_dir
    assert set(read_running(conf, (a, b))) == {"a", "b"}
    assert read_running(conf, (dataclasses.replace(a, digest="sha256:other"),)) == {}
    assert read_running(conf, (dataclasses.replace(a, api_key="sk-vllm-othertest"),)) == {}
    assert read_running(conf, (dataclasses.replace(a, digest=""),)) == {}  # no digest: nothing to compare


def test_programs_read_back_as_written(tmp_path: Path) -> None:
    a, b = server("a", 10, 8001, args=("-tp", "2")), server("b", 10, 8002)
    install(tmp_path, (a, b), (gpu(0), gpu(1), gpu(2)))
    running = read_running(settings_in(tmp_path).conf_dir, (a, b))
    assert running["a"] == Running(share=pytest.approx(0.9), gpus=(0, 1), after=())  # type: ignore[arg-type]
    assert running["b"].gpus == (2,)


def test_a_running_server_keeps_its_gpus_when_the_set_changes(tmp_path: Path) -> None:
    # a leaves GPU 0: first-fit-decreasing alone would now put b (the heaviest) on GPU 0; it stays on GPU 1
    a, b = server("a", 20, 8001), server("b", 20, 8002)
    first = install(tmp_path, (a, b), (gpu(0), gpu(1)))
    assert "CUDA_VISIBLE_DEVICES=\"1\"" in first["b"].text
    small = server("c", 10, 8003)
    second = install(tmp_path, (b, small), (gpu(0), gpu(1)))
    assert second["b"].text == first["b"].text
    assert "CUDA_VISIBLE_DEVICES=\"0\"" in second["c"].text


def test_unreadable_or_foreign_programs_are_not_kept(tmp_path: Path, box_json: dict[str, Any]) -> None:
    conf = settings_in(tmp_path).conf_dir
    conf.mkdir(parents=True)
    servers = parse_box(box_json, BOX).servers
    (conf / f"fleetllm-{servers[0].name}.conf").write_text("; not ours\n[program:x]\ncommand=vllm\n")
    (conf / f"fleetllm-{servers[1].name}.conf").write_bytes(b"\xff\xfe")
    assert read_running(conf, servers) == {}
