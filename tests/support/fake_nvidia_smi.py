#!/usr/bin/env python3
"""The fake `nvidia-smi` for tests: runs reconciler/fleetllm/demo/fake_nvidia_smi.py (the one implementation,
which `fleetllm demo` also uses), in this process. Symlink it as `nvidia-smi`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "reconciler"))  # the fleetllm package, whatever python3 runs this

from fleetllm.demo.fake_nvidia_smi import main

if __name__ == "__main__":
    sys.exit(main())
