"""The wheel carries what the pages need at run time: templates, CSS, JS and the OpenAPI document
(built with pip, as a user installs it)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import ROOT

SOURCES = ROOT / "reconciler"  # the wheel holds the fleetllm package from here
PAGES = SOURCES / "fleetllm" / "server" / "pages"


def test_the_wheel_ships_templates_static_files_and_the_api_document(tmp_path: Path) -> None:
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--disable-pip-version-check",
                            "--wheel-dir", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300,
                           check=False)
    assert built.returncode == 0, built.stderr
    [wheel] = tmp_path.glob("fleetllm-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assets = [p for p in PAGES.rglob("*") if p.is_file() and p.suffix in (".html", ".css", ".js")]
    assert len(assets) >= 10
    for asset in assets:
        assert str(asset.relative_to(SOURCES)) in names
    assert "fleetllm/_schemas/openapi.yaml" in names  # where schema_dir() finds it in an installed wheel
