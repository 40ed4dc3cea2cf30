"""The release's sdist and wheel (python -m build, as .github/workflows/release.yml runs it): named by the
one version, and both carry the Apache-2.0 LICENSE that the metadata declares."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from fleetllm_contract import version
from tests.conftest import ROOT

VERSION = version.__version__


def test_sdist_and_wheel_carry_the_license_and_the_version(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(tmp_path), str(ROOT)], capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    wheel, sdist = tmp_path / f"fleetllm-{VERSION}-py3-none-any.whl", tmp_path / f"fleetllm-{VERSION}.tar.gz"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([wheel.name, sdist.name])
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
