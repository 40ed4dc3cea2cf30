"""What a release is called, from the one version (contract/fleetllm_contract/version.py). Standard library
only: .github/workflows/release.yml runs it before anything is installed.

    python tools/release.py outputs --ref REF --repository OWNER/NAME [--tags TAG ...]
        key=value lines for $GITHUB_OUTPUT: version, tag (v<version>), major (v<major>), image
        (ghcr.io/<owner>/<name>, lower case), move_major (true when this version is the newest of its
        major among --tags, so v1 never moves back to an older 1.x). Exit 1 when REF is a tag other
        than v<version>: the tag and the source must name the same release.
    python tools/release.py notes [--changelog CHANGELOG.md]
        the CHANGELOG.md section of this version (empty when it has none)
    python tools/release.py check DIST [--scratch DIR] [--box FILE] [--example DIR] [--first-address ADDR]
        that the release's files install and run without the source tree: DIST must hold this version's
        sdist and wheel (python -m build --outdir DIST builds the wheel from the sdist); the wheel goes
        into a new virtual environment with its dependencies (pip, from the index pip is configured
        with), and from an empty directory, with no PYTHON*, FLEETLLM_* or LITELLM_* variable, it runs
        `fleetllm --version`, `fleetllm validate` on the example fleet, builds the box program from the
        installed packages (--box FILE keeps it) and runs it with `python -S` (the standard library
        alone), and runs `fleetllm demo --once`. Exit 1, with the step's output, when one fails. CI
        (tests/release/test_wheel_install.py, .github/workflows/ci.yml) and the release run it.
"""

from __future__ import annotations

import argparse
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSION_FILE = ROOT / "contract" / "fleetllm_contract" / "version.py"
REGISTRY = "ghcr.io"
_RELEASE = re.compile(r"v(\d+)\.(\d+)\.(\d+)")


class ReleaseError(Exception):
    pass


def version() -> str:
    value = runpy.run_path(str(VERSION_FILE))["__version__"]
    if not isinstance(value, str) or not _RELEASE.fullmatch("v" + value):
        raise ReleaseError(f"{VERSION_FILE}: __version__ {value!r} is not MAJOR.MINOR.PATCH")
    return value


def _key(tag: str) -> tuple[int, int, int] | None:
    match = _RELEASE.fullmatch(tag)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def moves_major(release: str, tags: Iterable[str]) -> bool:
    """Whether v<major> should point at `release` (X.Y.Z): only when no vX.*.* tag is newer."""
    mine = _key("v" + release)
    assert mine is not None
    newer = [k for k in map(_key, tags) if k is not None and k[0] == mine[0] and k > mine]
    return not newer


def outputs(ref: str, repository: str, tags: Sequence[str]) -> dict[str, str]:
    release = version()
    tag = f"v{release}"
    if ref.startswith("refs/tags/") and ref != f"refs/tags/{tag}":
        raise ReleaseError(f"{ref} does not name this source's version {release} ({VERSION_FILE.relative_to(ROOT)}): "
                           f"tag it {tag}, or change the version first")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repository):
        raise ReleaseError(f"{repository!r} is not OWNER/NAME")
    return {"version": release, "tag": tag, "major": f"v{release.split('.')[0]}",
            "image": f"{REGISTRY}/{repository.lower()}", "move_major": str(moves_major(release, tags)).lower()}


def notes(changelog: Path) -> str:
    """The `## <version>` section of the changelog, without its heading; empty when there is none."""
    release = version()
    text = changelog.read_text() if changelog.is_file() else ""
    match = re.search(rf"^## \[?{re.escape(release)}\]?[^\n]*\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    return match.group(1).strip() + "\n" if match else ""


def dist_files(dist: Path) -> tuple[Path, Path]:
    """This version's sdist and wheel in `dist`."""
    release = version()
    sdist, wheel = dist / f"fleetllm-{release}.tar.gz", dist / f"fleetllm-{release}-py3-none-any.whl"
    for path in (sdist, wheel):
        if not path.is_file():
            raise ReleaseError(f"{path} is missing: build this version's sdist and wheel with "
                               f"`python -m build --outdir {dist}`")
    return sdist, wheel


def clean_environment(bin_dir: Path) -> dict[str, str]:
    """What a user's shell would give a fresh install: this environment without PYTHON*, FLEETLLM_*,
    LITELLM_* or VIRTUAL_ENV (nothing that points into a checkout or changes what the demo runs), and a
    PATH of the virtual environment and the system's directories."""
    kept = {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTHON", "FLEETLLM_", "LITELLM_")) and k != "VIRTUAL_ENV"}
    return {**kept, "PATH": os.pathsep.join([str(bin_dir), "/usr/local/bin", "/usr/bin", "/bin"])}


def run_step(what: str, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout_s: float) -> str:
    """Run one step; its stdout and stderr together, or ReleaseError with their tail. Past its timeout the
    step gets SIGINT first (the demo then stops every process it started), SIGKILL a minute later."""
    started = time.monotonic()
    with subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as process:
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGINT)
            try:
                output, _ = process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                output, _ = process.communicate()
            raise ReleaseError(f"check: {what} did not finish in {timeout_s:g} s (in {cwd}):\n"
                               f"{_tail(output)}") from None
    if process.returncode != 0:
        raise ReleaseError(f"check: {what} exited {process.returncode} (in {cwd}):\n{_tail(output)}")
    print(f"check: {what}: ok in {time.monotonic() - started:.1f} s", flush=True)
    return output


def _tail(output: str, lines: int = 60) -> str:
    return "\n".join(output.rstrip().splitlines()[-lines:])


# Where the installed packages and data are: each must be inside the new virtual environment.
_PROBE = """\
import importlib.resources, fleetllm, fleetllm_contract, fleetllm_installer, fleetllm_gateway
for module in (fleetllm, fleetllm_contract, fleetllm_installer, fleetllm_gateway):
    print(module.__file__)
for data in ("_schemas/fleet.schema.json", "_schemas/openapi.yaml", "_fleet_example/placement.yaml"):
    print(importlib.resources.files("fleetllm").joinpath(data))
"""


def check(dist: Path, scratch: Path, *, example: Path, box: Path | None = None,
          demo_args: Sequence[str] = ()) -> None:
    """tools/release.py check (the module docstring): raises ReleaseError at the first step that fails."""
    release = version()
    _sdist, wheel = dist_files(dist)
    env_dir, run_dir = scratch / "venv", scratch / "run"
    run_dir.mkdir(parents=True)
    bin_dir = env_dir / "bin"
    python = bin_dir / "python"
    installing = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    # Without a pip of its own (ensurepip would add a quarter of a minute): this Python's pip installs into
    # it (--python), the wheel's dependencies from the index pip is configured with, through pip's cache.
    run_step("a new virtual environment", [sys.executable, "-m", "venv", "--without-pip", str(env_dir)],
             cwd=run_dir, env=installing, timeout_s=300)
    run_step(f"pip install {wheel.name}", [sys.executable, "-m", "pip", "--python", str(python), "install",
                                           "--disable-pip-version-check", "--quiet", str(wheel.resolve())],
             cwd=run_dir, env=installing, timeout_s=1200)
    env = clean_environment(bin_dir)
    said = run_step("fleetllm --version", [str(bin_dir / "fleetllm"), "--version"], cwd=run_dir, env=env,
                    timeout_s=120).strip()
    if said != f"fleetllm {release}":
        raise ReleaseError(f"check: fleetllm --version says {said!r}, not 'fleetllm {release}'")
    where = run_step("where the packages are", [str(python), "-c", _PROBE], cwd=run_dir, env=env,
                     timeout_s=120).split()
    home = env_dir.resolve()
    outside = [p for p in where if not Path(p).resolve().is_relative_to(home) or not Path(p).exists()]
    if outside:
        raise ReleaseError(f"check: not installed in {home}, or missing: {', '.join(outside)}; the wheel must carry "
                           "every package, the schemas and the example fleet (pyproject.toml, "
                           "[tool.hatch.build.targets.wheel])")
    run_step(f"fleetllm validate {example}", [str(bin_dir / "fleetllm"), "validate", str(example.resolve())],
             cwd=run_dir, env=env, timeout_s=300)
    program = box.resolve() if box is not None else run_dir / f"fleetllm-box-{release}.pyz"
    run_step("the box program from the installed packages",
             [str(python), "-m", "fleetllm_installer.zipapp", str(program)], cwd=run_dir, env=env, timeout_s=120)
    for args, name in ((["--version"], "fleetllm-installer"), (["gateway", "--version"], "fleetllm-gateway")):
        said = run_step(f"python -S {program.name} {' '.join(args)}", [str(python), "-S", str(program), *args],
                        cwd=run_dir, env=env, timeout_s=120).strip()
        if said != f"{name} {release}":
            raise ReleaseError(f"check: the box program says {said!r}, not '{name} {release}'")
    run_step("fleetllm demo --once", [str(bin_dir / "fleetllm"), "demo", "--once", *demo_args], cwd=run_dir,
             env=env, timeout_s=1200)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/release.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    out = sub.add_parser("outputs")
    out.add_argument("--ref", required=True)
    out.add_argument("--repository", required=True)
    out.add_argument("--tags", nargs="*", default=[])
    log = sub.add_parser("notes")
    log.add_argument("--changelog", type=Path, default=ROOT / "CHANGELOG.md")
    checking = sub.add_parser("check")
    checking.add_argument("dist", type=Path)
    checking.add_argument("--scratch", type=Path, help="an empty or new directory for the virtual environment and "
                          "the runs (kept); default: a temporary one, removed afterwards")
    checking.add_argument("--box", type=Path, help="where to write the box program it checks (default: the scratch)")
    checking.add_argument("--example", type=Path, default=ROOT / "fleet-repo-example")
    checking.add_argument("--first-address", help="fleetllm demo --first-address (default: the demo's)")
    args = parser.parse_args(argv)
    try:
        if args.command == "outputs":
            print("\n".join(f"{k}={v}" for k, v in outputs(args.ref, args.repository, args.tags).items()))
        elif args.command == "check":
            demo_args = ["--first-address", args.first_address] if args.first_address else []
            if args.scratch is not None:
                if args.scratch.exists() and any(args.scratch.iterdir()):
                    raise ReleaseError(f"--scratch {args.scratch} is not empty: give a new or empty directory")
                check(args.dist, args.scratch, example=args.example, box=args.box, demo_args=demo_args)
            else:
                scratch = Path(tempfile.mkdtemp(prefix="fleetllm-release-check-"))
                try:
                    check(args.dist, scratch, example=args.example, box=args.box, demo_args=demo_args)
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
            print(f"check: {args.dist}: the wheel installs and runs", flush=True)
        else:
            sys.stdout.write(notes(args.changelog))
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
