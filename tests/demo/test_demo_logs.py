"""Every log line of a full demo run is JSON in the one fleetllm format, with a level: the control
plane's (access log included), the provisioning scripts', the installer's, the launcher's and the box
gateway's (the example fleet with a gateway on its RunPod box). Only the programs fleetllm runs but did
not write keep their own format: supervisord's log, and vLLM's lines after the launcher became vLLM."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fleetllm.demo.fleet import addresses
from fleetllm.demo.procs import pids_mentioning
from tests.conftest import ROOT
from tests.demo.test_demo_real import FLEETLLM, assert_no_secret, free_block

pytestmark = pytest.mark.slow
LEVELS = {"debug", "info", "warning", "error", "critical"}
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
VLLM_LINE = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d ")  # vLLM's own format


def gateway_example(tmp_path: Path) -> Path:
    example = tmp_path / "example"
    shutil.copytree(ROOT / "fleet-repo-example", example)
    placement = example / "placement.yaml"
    text = placement.read_text()
    runpod = "    notes: secure cloud\n    servers:\n      - [gemma3-27b, 8001]\n"
    assert runpod in text
    placement.write_text(text.replace(runpod, "    notes: secure cloud\n    gateway: 8001\n    servers:\n"
                                              "      - [gemma3-27b, 9001]\n"))
    return example


def entry(line: str, where: Path) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        raise AssertionError(f"{where}: not a JSON line: {line!r}") from None
    assert isinstance(value, dict), f"{where}: {line!r}"
    assert value.get("level") in LEVELS, f"{where}: no level: {line!r}"
    assert ISO.fullmatch(value.get("ts", "")), f"{where}: ts is not ISO-8601 UTC: {line!r}"
    assert value.get("logger") and isinstance(value.get("event"), str), f"{where}: {line!r}"
    return value


def test_every_log_line_of_a_demo_run_is_json_with_a_level(tmp_path: Path) -> None:
    workdir, first = tmp_path / "demo", free_block()
    env = {k: v for k, v in os.environ.items() if k not in ("LITELLM_MASTER_KEY", "FLEETLLM_DEMO_LITELLM")}
    done = subprocess.run([str(FLEETLLM), "demo", "--workdir", str(workdir), "--first-address", first, "--timeout",
                           "240", "--once", "--example", str(gateway_example(tmp_path))],
                          env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert pids_mentioning(str(workdir)) == []

    loggers: dict[str, int] = {}
    texts = []
    for path in sorted(workdir.rglob("*.log")):
        text = path.read_text(errors="replace")
        texts.append(text)
        if path.name == "supervisord.log":  # supervisord's own log: not fleetllm's to format
            continue
        vllm_program = path.parent.name == "logs" and path.name != "gateway.log"
        for line in text.splitlines():
            if vllm_program and VLLM_LINE.match(line):  # the stub speaks like vLLM once the launcher became it
                continue
            found = entry(line, path)
            loggers[found["logger"]] = loggers.get(found["logger"], 0) + 1
    # Each component wrote its part of the run (so the check above read real lines of each).
    for logger in ("fleetllm.revisions", "fleetllm.http", "fleetllm.access", "fleetllm.provision", "fleetllm.installer", "fleetllm.launch",
                   "fleetllm.demo", "gateway"):
        assert loggers.get(logger), (logger, loggers)
    gateway_box = addresses(first, 4)[2]
    gateway_log = (workdir / "simulated-boxes" / gateway_box / "data" / "fleetllm" / "logs" / "gateway.log").read_text()
    assert '"event":"listening"' in gateway_log
    assert_no_secret(workdir, done.stdout + done.stderr, *texts)
