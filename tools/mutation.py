"""Mutation testing of the pure core with mutmut 3, one module at a time (`make mutation`).

    .venv/bin/python tools/mutation.py [MODULE ...] [--changed-since REF] [--floor 80] [--max-children 1]
                                      [--json FILE] [--keep]

Each module of MODULES is mutated on its own, against its own unit tests only (never the slow
integration suites: a mutant's run must be seconds, and the machine is shared). For each one a scratch
copy of the project is made (reconciler/, tests/, schemas/, fleet-repo-example/, bench/ and a
pyproject.toml whose [tool.mutmut] names that module's files and tests), mutmut runs there, and its
counts are read from `mutmut export-cicd-stats`. The project tree is never touched: mutmut writes its
`mutants/` directory in the scratch copy, removed afterwards (--keep keeps it, to `mutmut show` a
survivor there).

Score = killed / (killed + survived + no tests + suspicious + timeout + segfault), the mutants mutmut made
minus those it skipped. A module below --floor (percent) fails the run (exit 1). With --changed-since REF
only the modules with a file changed since REF (`git diff --name-only REF...HEAD`, plus uncommitted
changes) run, and --ci keeps only the modules fast enough for CI: together, the cheap CI variant.
Prints one table, and with --json the same figures and the survivors.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Module:
    name: str
    sources: tuple[str, ...]  # files mutated
    tests: tuple[str, ...]  # the unit tests that must kill them (pytest node ids or paths)
    in_ci: bool = True  # False: too slow or too big for CI here; `make mutation` runs it


# The unit tests only: the Hypothesis property suites (tests/*/test_properties.py) run hundreds of examples
# per mutant and would make a module take most of an hour on the shared 2-core machine.
MODULES: tuple[Module, ...] = (
    Module("validation", ("reconciler/fleetllm/core/fleet/validate.py", "reconciler/fleetllm/core/fleet/rules.py",
                          "reconciler/fleetllm/core/fleet/build.py", "reconciler/fleetllm/core/fleet/flags.py"),
           ("tests/fleet/test_rules.py", "tests/fleet/test_flags.py", "tests/fleet/test_render.py",
            "tests/fleet/test_schema.py", "tests/boxgateway/test_rules.py", "tests/fleet/test_build_settings.py",
            "tests/fleet/test_validate_files.py", "tests/fleet/test_rules_exact.py", "tests/fleet/test_build_exact.py"),
           in_ci=False),
    Module("render", ("reconciler/fleetllm/core/fleet/render.py",),
           ("tests/fleet/test_render.py", "tests/fleet/test_render_exact.py", "tests/boxgateway/test_render.py")),
    Module("bearer", ("reconciler/fleetllm/core/fleet/bearer.py",),
           ("tests/fleet/test_bearer.py", "tests/fleet/test_bearer_exact.py")),
    Module("verdict", ("reconciler/fleetllm/core/judge/verdict.py",),
           ("tests/reconcile/test_verdict.py", "tests/reconcile/test_verdict_exact.py",
            "tests/reconcile/test_plan.py")),
    Module("plan", ("reconciler/fleetllm/core/judge/plan.py",), ("tests/reconcile/test_plan.py",
                                                                "tests/reconcile/test_plan_exact.py")),
    Module("rollout", ("reconciler/fleetllm/core/rollout/step.py", "reconciler/fleetllm/core/rollout/change.py",
                       "reconciler/fleetllm/core/rollout/control.py"),
           ("tests/rollout/test_step_sim.py", "tests/rollout/test_control.py"), in_ci=False),
    Module("diff", ("reconciler/fleetllm/core/diff/compute.py", "reconciler/fleetllm/core/diff/fields.py",
                    "reconciler/fleetllm/core/diff/routes.py", "reconciler/fleetllm/core/diff/servers.py",
                    "reconciler/fleetllm/core/diff/summary.py"),
           ("tests/diff/test_report.py", "tests/diff/test_golden.py", "tests/diff/test_markdown.py",
            "tests/diff/test_report_exact.py"), in_ci=False),
)
COPIED = ("tests", "schemas", "fleet-repo-example", "bench", "pyproject.toml")
# The import packages go under src/ in the scratch copy: mutmut 3 names a mutant by its file's path
# relative to ./, src/ or source/, which must be the module's import name (fleetllm.core..., not
# reconciler.fleetllm.core...), or no test is ever matched to a mutant.
PACKAGES = {"reconciler/fleetllm": "src/fleetllm", "contract/fleetllm_contract": "src/fleetllm_contract",
            "installer/fleetllm_installer": "src/fleetllm_installer",
            "gateway/fleetllm_gateway": "src/fleetllm_gateway"}


def in_scratch(path: str) -> str:
    """A project path as the scratch copy has it (reconciler/fleetllm/x.py -> src/fleetllm/x.py)."""
    for old, new in PACKAGES.items():
        if path.startswith(old + "/"):
            return new + path[len(old):]
    return path
COUNTED = ("killed", "survived", "no_tests", "suspicious", "timeout", "segfault")


@dataclass(frozen=True)
class Score:
    module: str
    counts: dict[str, int]
    survivors: tuple[str, ...]
    seconds: float

    @property
    def total(self) -> int:
        return sum(self.counts.get(k, 0) for k in COUNTED)

    @property
    def percent(self) -> float:
        return 100.0 * self.counts.get("killed", 0) / self.total if self.total else 100.0


def changed_files(ref: str) -> set[str] | None:
    """Files changed since `ref` (its merge base with HEAD) plus uncommitted ones; None: no such ref."""
    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)

    if git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").returncode != 0:
        return None
    out = git("diff", "--name-only", f"{ref}...HEAD").stdout + git("diff", "--name-only", "HEAD").stdout
    return {line.strip() for line in out.splitlines() if line.strip()}


def changed_modules(changed: set[str]) -> list[Module]:
    return [m for m in MODULES if changed & set(m.sources)]


def toml_list(items: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def scratch_copy(module: Module, where: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", "mutants", "golden-out")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, where / name, ignore=ignore, symlinks=True)
        else:
            shutil.copy2(source, where / name)
    for old, new in PACKAGES.items():
        shutil.copytree(ROOT / old, where / new, ignore=ignore, symlinks=True)
    pyproject = (where / "pyproject.toml").read_text(encoding="utf-8")
    start = pyproject.find("[tool.mutmut]")
    if start >= 0:  # the project's own section is the default for a bare `mutmut run`; replaced here
        end = pyproject.find("\n[", start + 1)
        pyproject = pyproject[:start] + (pyproject[end + 1:] if end >= 0 else "")
    pyproject += f"""
[tool.mutmut]
source_paths = ["src/"]
only_mutate = {toml_list([in_scratch(source) for source in module.sources])}
pytest_add_cli_args_test_selection = {toml_list(module.tests)}
pytest_add_cli_args = ["-p", "no:cacheprovider", "-p", "no:randomly", "-q", "--timeout=120"]
also_copy = ["schemas/", "fleet-repo-example/", "bench/"]
use_git_change_detection = false
"""
    (where / "pyproject.toml").write_text(pyproject, encoding="utf-8")


def run_module(module: Module, max_children: int, keep: bool) -> Score:
    mutmut = Path(sys.executable).parent / "mutmut"
    if not mutmut.exists():
        raise SystemExit(f"no mutmut beside {sys.executable}: pip install -e '.[mutation]' (make mutation does)")
    where = Path(tempfile.mkdtemp(prefix=f"fleetllm-mutation-{module.name}-"))
    started = time.monotonic()
    try:
        scratch_copy(module, where)
        env = {**os.environ, "PYTHONHASHSEED": "0", "HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "")}
        env.pop("FLEETLLM_REQUIRE_INTEGRATION", None)  # unit tests only: nothing here may need a service
        run = subprocess.run([str(mutmut), "run", "--max-children", str(max_children)], cwd=where, env=env,
                             capture_output=True, text=True)
        if run.returncode != 0:
            tail = (run.stdout + run.stderr)[-3000:]
            raise SystemExit(f"mutmut failed on {module.name} (exit {run.returncode}) in {where}:\n{tail}")
        subprocess.run([str(mutmut), "export-cicd-stats"], cwd=where, env=env, check=True, capture_output=True)
        stats = json.loads((where / "mutants" / "mutmut-cicd-stats.json").read_text(encoding="utf-8"))
        results = subprocess.run([str(mutmut), "results"], cwd=where, env=env, check=True, capture_output=True,
                                 text=True).stdout
        survivors = tuple(line.strip() for line in results.splitlines() if line.strip().endswith(
            (": survived", ": no tests", ": suspicious", ": timeout", ": segfault")))
        return Score(module.name, {k: int(v) for k, v in stats.items() if isinstance(v, int)}, survivors,
                     time.monotonic() - started)
    finally:
        if keep:
            print(f"[mutation] {module.name}: scratch copy kept at {where}", file=sys.stderr)
        else:
            shutil.rmtree(where, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="*", metavar="MODULE", help="of: " + ", ".join(m.name for m in MODULES))
    parser.add_argument("--changed-since", metavar="REF", help="only the modules with a file changed since REF")
    parser.add_argument("--floor", type=float, default=80.0, help="minimum score per module, percent (default 80)")
    parser.add_argument("--max-children", type=int, default=1, help="mutmut's parallel workers (default 1)")
    parser.add_argument("--json", metavar="FILE", help="write the scores and survivors there")
    parser.add_argument("--keep", action="store_true", help="keep each scratch copy (to `mutmut show` survivors)")
    parser.add_argument("--ci", action="store_true",
                        help="only the modules fast enough for CI (" + ", ".join(m.name for m in MODULES if m.in_ci)
                             + ")")
    args = parser.parse_args()
    by_name = {m.name: m for m in MODULES}
    unknown = [n for n in args.modules if n not in by_name]
    if unknown:
        parser.error(f"no module {', '.join(unknown)}; known: {', '.join(by_name)}")
    chosen = [by_name[n] for n in args.modules] or list(MODULES)
    if args.ci:
        chosen = [m for m in chosen if m.in_ci]
    if args.changed_since:
        files = changed_files(args.changed_since)
        if files is None:  # e.g. a shallow clone: what changed cannot be told, so everything runs
            print(f"[mutation] {args.changed_since} is not a commit here: cannot tell what changed, so every module "
                  "runs")
        else:
            changed = {m.name for m in changed_modules(files)}
            chosen = [m for m in chosen if m.name in changed]
            if not chosen:
                print(f"[mutation] no core module changed since {args.changed_since}: nothing to mutate")
                return 0
    scores: list[Score] = []
    for module in chosen:
        print(f"[mutation] {module.name}: {', '.join(module.sources)} against {', '.join(module.tests)}", flush=True)
        score = run_module(module, args.max_children, args.keep)
        scores.append(score)
        print(f"[mutation] {module.name}: {score.percent:.1f}% ({score.counts.get('killed', 0)}/{score.total} killed)"
              f" in {score.seconds:.0f}s", flush=True)
    print(f"\n{'module':<12} {'score':>7} {'killed':>7} {'survived':>9} {'no tests':>9} {'timeout':>8}")
    for s in scores:
        c = s.counts
        print(f"{s.module:<12} {s.percent:>6.1f}% {c.get('killed', 0):>7} {c.get('survived', 0):>9} "
              f"{c.get('no_tests', 0):>9} {c.get('timeout', 0):>8}")
    for s in scores:
        for survivor in s.survivors:
            print(f"  {s.module}: {survivor}")
    if args.json:
        Path(args.json).write_text(json.dumps([{"module": s.module, "percent": round(s.percent, 1), **s.counts,
                                                 "survivors": list(s.survivors), "seconds": round(s.seconds)}
                                                for s in scores], indent=2) + "\n", encoding="utf-8")
    below = [s for s in scores if s.percent < args.floor]
    if below:
        print(f"\nbelow the floor of {args.floor:g}%: " + ", ".join(f"{s.module} {s.percent:.1f}%" for s in below))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
