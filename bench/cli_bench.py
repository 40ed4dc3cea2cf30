"""The command line's own cost, as a user pays it: whole processes, start-up included.

    .venv/bin/python bench/cli_bench.py [--boxes 1000] [--runs 15] [--check-jsonschema PATH | --install]

Runs, each `--runs` times as a fresh process: `fleetllm --version`, `fleetllm validate DIR` on
bench/fleetgen.py's repository of `--boxes` boxes (3 servers each), and check-jsonschema on the same
files with their schemas (schemas/*.schema.json): once per file (it takes one schema per run), and
their sum. For each it reports the median and best CPU time (user + sys of the child, from
getrusage) and wall time, and the load average before and after: on a shared machine CPU time is what
compares, wall time is what a user waits. `--install` puts check-jsonschema into a temporary virtual
environment first (pip, from the package registry); `--check-jsonschema` takes an installed one.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fleetgen import write_fleet

FLEET_FILES = ("fleet", "models", "placement")


def run(command: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one process running `command` to its end (exit 0 required)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}: {done.stdout[-500:]}{done.stderr[-500:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def measure(commands: list[list[str]], runs: int) -> tuple[list[float], list[float]]:
    """CPU and wall time of each round, a round being every command of `commands` once, one after another."""
    cpu, wall = [], []
    for _ in range(runs):
        total_cpu = total_wall = 0.0
        for command in commands:
            c, w = run(command)
            total_cpu += c
            total_wall += w
        cpu.append(total_cpu)
        wall.append(total_wall)
    return cpu, wall


def installed_check_jsonschema(directory: Path) -> str:
    subprocess.run([sys.executable, "-m", "venv", str(directory)], check=True)
    subprocess.run([str(directory / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                    "check-jsonschema"], check=True)
    return str(directory / "bin" / "check-jsonschema")


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--boxes", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--check-jsonschema", metavar="PATH", help="an installed check-jsonschema")
    parser.add_argument("--install", action="store_true", help="install check-jsonschema into a temporary venv")
    args = parser.parse_args()
    fleetllm = str(Path(sys.executable).parent / "fleetllm")
    with tempfile.TemporaryDirectory() as tmp:
        checker = args.check_jsonschema or (installed_check_jsonschema(Path(tmp) / "venv") if args.install
                                            else shutil.which("check-jsonschema"))
        fleet = write_fleet(Path(tmp) / "fleet", args.boxes)
        cases: dict[str, list[list[str]]] = {
            "fleetllm --version": [[fleetllm, "--version"]],
            f"fleetllm validate ({args.boxes} boxes)": [[fleetllm, "validate", str(fleet)]],
        }
        if checker:
            for name in FLEET_FILES:
                cases[f"check-jsonschema {name}.yaml"] = [[checker, "--schemafile",
                                                          str(ROOT / "schemas" / f"{name}.schema.json"),
                                                          str(fleet / f"{name}.yaml")]]
            cases["check-jsonschema, all three"] = [command for name in FLEET_FILES
                                                    for command in cases[f"check-jsonschema {name}.yaml"]]
        else:
            print("check-jsonschema not found: pass --check-jsonschema PATH or --install", file=sys.stderr)
        for commands in cases.values():  # warm the page cache and the bytecode caches once
            measure(commands, 1)
        print(f"load average before: {load()}; {os.cpu_count()} CPUs; Python {sys.version.split()[0]}")
        results = {label: measure(commands, args.runs) for label, commands in cases.items()}
        print(f"load average after: {load()}")
    print(f"\n{'':40s} {'CPU median':>11s} {'CPU best':>9s} {'wall median':>12s} {'wall best':>10s}"
          f"   ({args.runs} runs)")
    for label, (cpu, wall) in results.items():
        print(f"{label:40s} {statistics.median(cpu) * 1000:8.0f} ms {min(cpu) * 1000:6.0f} ms "
              f"{statistics.median(wall) * 1000:9.0f} ms {min(wall) * 1000:7.0f} ms")
    validate = statistics.median(results[f"fleetllm validate ({args.boxes} boxes)"][0])
    for label in ("check-jsonschema placement.yaml", "check-jsonschema, all three"):
        if label in results:
            print(f"validate CPU / {label} CPU: {validate / statistics.median(results[label][0]):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
