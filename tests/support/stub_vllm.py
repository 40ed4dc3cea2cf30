#!/usr/bin/env python3
"""The stub vLLM for tests: runs reconciler/fleetllm/demo/stub_vllm.py (the one implementation, which
`fleetllm demo` also uses), in this process. Symlink it as `vllm`, or run it with any Python."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "reconciler"))  # the fleetllm package, whatever python3 runs this

from fleetllm.demo.stub_vllm import main

if __name__ == "__main__":
    sys.exit(main())
