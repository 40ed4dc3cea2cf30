"""The stub vLLM's log lines stay whole when its request threads log at once (a demo's log check read an
empty line where two threads' print() calls had interleaved their text and newlines)."""

from __future__ import annotations

import io
import sys
import threading
from contextlib import redirect_stdout
from pathlib import Path

from fleetllm.demo import stub_vllm

LINES = 3000


def test_lines_logged_by_many_threads_at_once_are_each_whole(tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # a thread switch wherever one can happen
    try:
        # Unbuffered, as the stub runs under supervisord (PYTHONUNBUFFERED): each write a system call,
        # which lets another thread run between a line's text and its newline.
        with io.TextIOWrapper(log.open("wb", buffering=0), write_through=True) as out, redirect_stdout(out):
            threads = [threading.Thread(target=lambda n=n: [stub_vllm.log(f"thread {n} line {i}") for i in range(LINES)])
                       for n in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        sys.setswitchinterval(interval)
    lines = log.read_text().split("\n")
    assert lines.pop() == ""  # the text ends with a newline
    assert len(lines) == 8 * LINES
    for line in lines:
        assert line.startswith("INFO ") and line.count("[stub_vllm]") == 1, repr(line)
    assert sorted(line.split("] ", 1)[1] for line in lines) == sorted(
        f"thread {n} line {i}" for n in range(8) for i in range(LINES))
