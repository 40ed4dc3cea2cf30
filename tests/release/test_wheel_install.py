"""Releases that install (issue 24, item 6): the wheel `python -m build` made (from the sdist), installed
into a new virtual environment with its dependencies from the index pip is configured with, runs from an
empty directory with nothing of the checkout on its path: `fleetllm --version`, `fleetllm validate` on the
example fleet, the box program built from the installed packages under `python -S`, and `fleetllm demo
--once`. tools/release.py check does it, as .github/workflows/ci.yml and release.yml run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fleetllm.demo.procs import pids_mentioning
from fleetllm_contract import version
from tests.conftest import ROOT
from tests.demo.test_demo_real import free_block
from tests.release.conftest import Built

VERSION = version.__version__
TOOL = ROOT / "tools" / "release.py"
STEPS = ("a new virtual environment", f"pip install fleetllm-{VERSION}-py3-none-any.whl", "fleetllm --version",
         "where the packages are", f"fleetllm validate {ROOT / 'fleet-repo-example'}",
         "the box program from the installed packages", f"python -S fleetllm-box-{VERSION}.pyz --version",
         f"python -S fleetllm-box-{VERSION}.pyz gateway --version", "fleetllm demo --once")


# Building and installing (about 30 s with pip's cache warm) and a demo run (about 30 s on 2 idle cores)
# take longer than the suite's hang guard on a loaded machine; the tool's own step timeouts come first.
@pytest.mark.timeout(2400)
def test_the_built_wheel_installs_and_runs_outside_the_source_tree(built: Built, tmp_path: Path) -> None:
    scratch, box = tmp_path / "check", tmp_path / f"fleetllm-box-{VERSION}.pyz"
    done = subprocess.run([sys.executable, str(TOOL), "check", str(built.dist), "--scratch", str(scratch),
                           "--box", str(box), "--first-address", free_block()],
                          capture_output=True, text=True, timeout=2300, check=False)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
    said = [line.split(": ok in ")[0] for line in done.stdout.splitlines() if ": ok in " in line]
    assert said == [f"check: {step}" for step in STEPS], done.stdout
    assert done.stdout.rstrip().endswith(f"check: {built.dist}: the wheel installs and runs")
    assert box.is_file()  # the box program it ran, as the release attaches it
    assert list((scratch / "run").iterdir()) == [], "the demo or a command wrote into its working directory"
    assert pids_mentioning(str(scratch)) == []  # the demo stopped every process it started


def test_the_check_refuses_a_folder_without_this_versions_files(tmp_path: Path) -> None:
    (tmp_path / f"fleetllm-{VERSION}.tar.gz").write_bytes(b"")
    done = subprocess.run([sys.executable, str(TOOL), "check", str(tmp_path)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (f"release: {tmp_path / f'fleetllm-{VERSION}-py3-none-any.whl'} is missing: build "
                                   f"this version's sdist and wheel with `python -m build --outdir {tmp_path}`")
    scratch = tmp_path / "used"
    scratch.mkdir()
    (scratch / "file").write_text("x")
    done = subprocess.run([sys.executable, str(TOOL), "check", str(tmp_path), "--scratch", str(scratch)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and done.stderr.startswith(f"release: --scratch {scratch} is not empty"), done.stderr
