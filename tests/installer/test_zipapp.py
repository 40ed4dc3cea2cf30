"""The box program (fleetllm_installer.zipapp) bundles the box contract from contract/, the installer and the
gateway, each whole, from where Python imports them; a package it cannot find stops the build instead of
leaving a program that would fail on the box. (test_main.py runs it with `python -S`; tests/release
runs the one built from an installed wheel.)"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from fleetllm_installer import zipapp
from fleetllm_installer.errors import InstallerError
from tests.conftest import ROOT

FOLDERS = {"fleetllm_contract": ROOT / "contract" / "fleetllm_contract",
           "fleetllm_installer": ROOT / "installer" / "fleetllm_installer",
           "fleetllm_gateway": ROOT / "gateway" / "fleetllm_gateway"}


def test_it_bundles_the_contract_the_installer_and_the_gateway_whole() -> None:
    with zipfile.ZipFile(io.BytesIO(zipapp.build_zipapp_bytes())) as archive:
        names = set(archive.namelist())
        for package, folder in FOLDERS.items():
            sources = {p.relative_to(folder).as_posix() for p in folder.rglob("*.py") if "__pycache__" not in p.parts}
            assert {n.removeprefix(f"{package}/") for n in names if n.startswith(f"{package}/")} == sources, package
            assert archive.read(f"{package}/__init__.py") == (folder / "__init__.py").read_bytes()
    assert {n.split("/")[0] for n in names} == {"__main__.py", *FOLDERS}


def test_a_package_it_cannot_find_stops_the_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(zipapp, "PACKAGES", (*zipapp.PACKAGES, "fleetllm_no_such_package"))
    with pytest.raises(InstallerError, match=r"needs the import package fleetllm_no_such_package .* reinstall"):
        zipapp.build_zipapp(tmp_path / "box.pyz")
    assert not (tmp_path / "box.pyz").exists()
