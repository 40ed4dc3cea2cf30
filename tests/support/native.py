"""One mypyc build of this checkout's gateway per test session (tools/build_gateway_native.py, about 40 s),
shared by the tests of the build itself and of its delivery to boxes."""

from __future__ import annotations

import importlib.machinery
import shutil
import subprocess
import sys
from pathlib import Path

from fleetllm_contract.gatewaynative import tag_of
from tests.conftest import ROOT

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
TAG = tag_of(SUFFIX)

_built: dict[str, Path] = {}


def build_this_checkout(scratch: Path) -> Path:
    """The build, made with the documented command the first time a session asks (into `scratch`)."""
    if "build" not in _built:
        target = scratch / "build"
        done = subprocess.run([sys.executable, "tools/build_gateway_native.py", str(target)], cwd=ROOT,
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout == f"{target}: 10 modules compiled for Python {sys.version.split()[0]} ({SUFFIX})\n"
        _built["build"] = target
    return _built["build"]


def builds_directory(build: Path, target: Path) -> Path:
    """A directory of builds as the control plane reads it (server.gateway_native): `target/<tag>/`."""
    assert TAG is not None
    shutil.copytree(build, target / TAG)
    return target
