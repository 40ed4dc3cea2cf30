"""Peak memory of a process tree: sums VmRSS and PSS over a process and all its descendants every
`--interval` seconds until it exits, then prints the peaks. Used for the real-vLLM suite's figures in
docs/benchmarks.md (a test run's tree holds supervisord and every vLLM it starts):

    .venv/bin/pytest -q tests/realvllm & .venv/bin/python bench/tree_memory.py $!
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(proc.name))
    return kids


def tree(root: int) -> list[int]:
    kids, found, todo = children_map(), [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(kids.get(pid, []))
    return found


def kib(pid: int, field: str, name: str = "status") -> int:
    try:
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("pid", type=int)
    parser.add_argument("--interval", type=float, default=2.0)
    args = parser.parse_args()
    peak_rss = peak_pss = samples = 0
    while Path(f"/proc/{args.pid}").exists():
        pids = tree(args.pid)
        peak_rss = max(peak_rss, sum(kib(p, "VmRSS") for p in pids))
        peak_pss = max(peak_pss, sum(kib(p, "Pss", "smaps_rollup") for p in pids))
        samples += 1
        time.sleep(args.interval)
    print(f"peak RSS {peak_rss / 1024:.0f} MiB, peak PSS {peak_pss / 1024:.0f} MiB over {samples} samples")


if __name__ == "__main__":
    main()
