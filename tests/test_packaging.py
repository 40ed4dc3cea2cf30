"""The wheel installs only import packages that carry the project's name, so PyPA's `installer` (which
packaging tools depend on) and fleetllm share one environment without overwriting each other, in
either order, and removing one leaves the other whole. Real pip, a real wheel, a real venv."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OUR_PACKAGES = {"fleetllm", "fleetllm_contract", "fleetllm_installer", "fleetllm_gateway"}


def _pip(python: Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args], check=True,
                   capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    _pip(Path(sys.executable), "wheel", "--no-deps", "-w", str(out), str(ROOT))
    _pip(Path(sys.executable), "download", "--no-deps", "-d", str(out), "installer")
    found = {p.name.split("-")[0]: p for p in out.glob("*.whl")}
    assert set(found) == {"fleetllm", "installer"}, found
    return found


def test_the_wheel_holds_only_our_names(wheels: dict[str, Path]) -> None:
    with zipfile.ZipFile(wheels["fleetllm"]) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert tops - {n for n in tops if n.endswith(".dist-info")} == OUR_PACKAGES
    with zipfile.ZipFile(wheels["installer"]) as archive:
        theirs = {name.split("/")[0] for name in archive.namelist() if not name.split("/")[0].endswith(".dist-info")}
    assert theirs == {"installer"}  # PyPA's: the name our installer package had before
    assert not theirs & tops


@pytest.mark.parametrize("order", ["ours-first", "theirs-first"])
def test_pypa_installer_beside_fleetllm(wheels: dict[str, Path], tmp_path: Path, order: str) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    first, second = (("fleetllm", "installer") if order == "ours-first" else ("installer", "fleetllm"))
    for name in (first, second):
        _pip(python, "install", "--no-deps", str(wheels[name]))
    # Both work: PyPA's module entry point, and our standard-library packages (the box side).
    done = subprocess.run([str(python), "-m", "installer", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "wheel" in done.stdout.lower(), done.stderr
    probe = ("import installer, fleetllm, fleetllm_installer.main, fleetllm_contract.boxjson;"
             "print(installer.__file__); print(fleetllm_installer.main.__file__)")
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    theirs, ours = done.stdout.split()
    assert Path(theirs).parent.name == "installer" and Path(ours).parent.name == "fleetllm_installer"
    # Removing PyPA's leaves ours whole, and the other way round.
    _pip(python, "uninstall", "-y", "installer")
    done = subprocess.run([str(python), "-c", "import fleetllm_installer.main, fleetllm_gateway, fleetllm"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    _pip(python, "install", "--no-deps", str(wheels["installer"]))
    _pip(python, "uninstall", "-y", "fleetllm")
    done = subprocess.run([str(python), "-m", "installer", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
