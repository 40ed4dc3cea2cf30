"""`fleetllm serve` must work for the suites that run it: when `serve --help` fails, the control plane is
broken, which is a failure of those suites, never a reason to skip them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FLEETLLM = Path(sys.executable).parent / "fleetllm"


def require_serve(fleetllm: Path = FLEETLLM) -> None:
    """Fail the test, with what `serve --help` said, unless `fleetllm serve --help` exits 0."""
    try:
        done = subprocess.run([str(fleetllm), "serve", "--help"], capture_output=True, text=True, timeout=120,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"`{fleetllm} serve --help` did not run: {exc}", pytrace=False)
    if done.returncode != 0:
        pytest.fail(f"`fleetllm serve --help` exited {done.returncode}: the control plane is broken\n"
                    f"{(done.stdout + done.stderr)[-2000:]}", pytrace=False)
