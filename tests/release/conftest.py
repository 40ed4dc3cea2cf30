"""The release's files, built once per run (`python -m build`, as .github/workflows/release.yml builds them:
the sdist from the tree, then the wheel from the sdist), for test_dist.py and test_wheel_install.py.

The opt-in Docker test (test_image_docker.py) is collected only with FLEETLLM_TEST_DOCKER=1: CI has no
Docker engine, and a skipped test there would be a failure. tests/release/test_image.py plays the image's
runtime stage without Docker in every run."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

collect_ignore = [] if os.environ.get("FLEETLLM_TEST_DOCKER") == "1" else ["test_image_docker.py"]


@dataclass(frozen=True)
class Built:
    dist: Path  # holds the sdist and the wheel, nothing else
    output: str  # what `python -m build` said


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    dist = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return Built(dist, done.stdout + done.stderr)
