"""`llmfleet serve` must work for the suites that run it: when `serve --help` fails, the control plane is
broken, which is a failure of those suites, never a reason to skip them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

LLMFLEET = Path(sys.executable).parent / "llmfleet"


def require_serve(llmfleet: Path = LLMFLEET) -> None:
    """Fail the test, with what `serve --help` said, unless `llmfleet serve --help` exits 0."""
    try:
        done = subprocess.run([str(llmfleet), "serve", "--help"], capture_output=True, text=True, timeout=120,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"`{llmfleet} serve --help` did not run: {exc}", pytrace=False)
    if done.returncode != 0:
        pytest.fail(f"`llmfleet serve --help` exited {done.returncode}: the control plane is broken\n"
                    f"{(done.stdout + done.stderr)[-2000:]}", pytrace=False)
