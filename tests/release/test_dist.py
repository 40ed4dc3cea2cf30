"""The release's sdist and wheel (python -m build, as .github/workflows/release.yml runs it): named by the
one version, both carry the Apache-2.0 LICENSE that the metadata declares, the wheel is built from the
sdist, and it carries every import package whole, the schemas and the example fleet, from the folders of
the source tree (test_wheel_install.py installs and runs it)."""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path

from fleetllm_contract import version
from tests.conftest import ROOT
from tests.release.conftest import Built

VERSION = version.__version__


def test_sdist_and_wheel_carry_the_license_and_the_version(built: Built) -> None:
    wheel, sdist = built.dist / f"fleetllm-{VERSION}-py3-none-any.whl", built.dist / f"fleetllm-{VERSION}.tar.gz"
    assert sorted(p.name for p in built.dist.iterdir()) == sorted([wheel.name, sdist.name])
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text  # the whole text, not a pointer to it
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(f"fleetllm-{VERSION}.dist-info/licenses/LICENSE").decode() == license_text
        metadata = archive.read(f"fleetllm-{VERSION}.dist-info/METADATA").decode()
    assert f"\nVersion: {VERSION}\n" in metadata
    assert "\nLicense-Expression: Apache-2.0\n" in metadata and "\nLicense-File: LICENSE\n" in metadata
    with tarfile.open(sdist) as archive:
        member = archive.extractfile(f"fleetllm-{VERSION}/LICENSE")
        assert member is not None and member.read().decode() == license_text
        info = archive.extractfile(f"fleetllm-{VERSION}/PKG-INFO")
        assert info is not None and f"\nVersion: {VERSION}\n" in info.read().decode()


def test_the_wheel_is_built_from_the_sdist(built: Built) -> None:
    """`python -m build` builds the sdist, then the wheel from it: a file the sdist lacks fails the wheel."""
    assert "Building sdist..." in built.output and "Building wheel from sdist" in built.output, built.output[-3000:]


def _tree(folder: Path, suffixes: tuple[str, ...] | None = None) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and (suffixes is None or p.suffix in suffixes)}


def test_the_wheel_carries_the_packages_the_schemas_and_the_example(built: Built) -> None:
    with zipfile.ZipFile(built.dist / f"fleetllm-{VERSION}-py3-none-any.whl") as archive:
        names = set(archive.namelist())

    def under(prefix: str) -> set[str]:
        return {n.removeprefix(prefix) for n in names if n.startswith(prefix)}

    sources = {"fleetllm_contract": ROOT / "contract" / "fleetllm_contract",
               "fleetllm_installer": ROOT / "installer" / "fleetllm_installer",
               "fleetllm_gateway": ROOT / "gateway" / "fleetllm_gateway"}
    for package, folder in sources.items():
        assert under(f"{package}/") == _tree(folder), package  # the box contract from contract/, whole
    assert {"provision/vast.sh", "provision/runpod.sh"} <= under("fleetllm_installer/")
    assert _tree(ROOT / "reconciler" / "fleetllm", (".py",)) <= under("fleetllm/")
    assert under("fleetllm/_schemas/") == _tree(ROOT / "schemas")
    assert under("fleetllm/_fleet_example/") == _tree(ROOT / "fleet-repo-example")


def test_a_plain_install_pulls_neither_gunicorn_nor_uvloop(built: Built) -> None:
    """`pip install fleetllm` installs what its Requires-Dist asks for without an extra: neither gunicorn
    (no part of fleetllm runs on it) nor uvloop (the gateway's faster loop, only with `[gateway]`); the
    benchmarks' matplotlib only with `[bench]`."""
    from email.parser import Parser

    from packaging.requirements import Requirement

    with zipfile.ZipFile(built.dist / f"fleetllm-{VERSION}-py3-none-any.whl") as archive:
        metadata = Parser().parsestr(archive.read(f"fleetllm-{VERSION}.dist-info/METADATA").decode())
    requirements = [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]

    def pulled(extra: str = "") -> set[str]:
        return {r.name.lower() for r in requirements if r.marker is None or r.marker.evaluate({"extra": extra})}

    assert {"aiohttp", "flask", "shtab", "apprise"} <= pulled()  # the parse sees the plain dependencies
    assert not {"gunicorn", "uvloop"} & pulled(), sorted(pulled())
    assert "matplotlib" in pulled("bench") and "gunicorn" not in pulled("bench") and "uvloop" in pulled("gateway")
    assert "gateway" in (metadata.get_all("Provides-Extra") or [])
