"""What a process has cost, read from /proc: the benches' machine-independent figure."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pids: list[int], stat: str = "/proc/{pid}/stat") -> float:
    """User + system CPU time so far of the processes `pids` (every thread of each; not their children),
    from /proc/PID/stat (`stat`: another file of the same format, a thread's /proc/self/task/TID/stat);
    a process that is gone counts nothing."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(stat.format(pid=pid)).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def task_seconds(tid: int) -> float:
    """CPU time so far of thread `tid` of this process, to the nanosecond, from its
    /proc/self/task/TID/schedstat (the stat file's ticks are 10 ms: a short run's share of a thread would
    read as 0 or a whole tick); a thread that is gone counts nothing."""
    try:
        return int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0]) / 1e9
    except OSError:
        return 0.0
