#!/usr/bin/env python3
"""Fake `nvidia-smi` for tests: answers the installer's --query-gpu call from the environment.

    FAKE_NVIDIA_SMI_GPUS   GPUs as "NAME:TOTAL_MIB:FREE_MIB" separated by ";" (default: one 80 GB H100)
    FAKE_NVIDIA_SMI_EXIT   exit with this code and the driver error message instead (e.g. 9)

Output is nvidia-smi's `--format=csv,noheader,nounits` shape (wire-formats.md §4). Any other query
fails like the real tool does for an unknown field.
"""

import os
import sys

EXPECTED = "--query-gpu=index,uuid,name,memory.total,memory.used,memory.free"


def main() -> int:
    code = os.environ.get("FAKE_NVIDIA_SMI_EXIT")
    if code:
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
              "Make sure that the latest NVIDIA driver is installed and running.")
        return int(code)
    if EXPECTED not in sys.argv[1:] or "--format=csv,noheader,nounits" not in sys.argv[1:]:
        print(f"Invalid combination of input arguments: {sys.argv[1:]}", file=sys.stderr)
        return 2
    spec = os.environ.get("FAKE_NVIDIA_SMI_GPUS", "NVIDIA H100 80GB HBM3:81559:81080")
    for index, gpu in enumerate(spec.split(";")):
        name, total, free = gpu.rsplit(":", 2)
        used = int(total) - int(free)
        print(f"{index}, GPU-{index:08x}-fake-{index:04x}, {name}, {total}, {used}, {free}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
