"""Build the gateway's compiled modules (fleetllm_gateway.native) for the Python that runs this script.

    python tools/build_gateway_native.py DIR
    python tools/build_gateway_native.py --builds DIR

Compiles the modules of fleetllm_gateway.native.COMPILED from this checkout's gateway/ with mypyc (mypy's
compiler; `make venv` installs it) into DIR, which it replaces: the compiled modules, their runtime and
MANIFEST.json (the interpreter they load in, and each source's sha256). A gateway started with
FLEETLLM_GATEWAY_NATIVE=DIR uses them when it runs these very sources on a Python of the same version and
ABI (its log line "listening" says `"compiled": true`); anything else runs the Python modules as before.
With --builds, DIR is a directory of builds as the control plane serves them to boxes (one subdirectory
per Python, named by its tag: fleetllm_contract.gatewaynative.tag_of), and only this Python's
subdirectory, DIR/<tag>, is replaced. The release runs that form once per Python and architecture
(docs/releasing.md), with the mypy of tools/gateway-native-requirements.txt.
Needs a C compiler and the Python's headers (Debian: gcc, python3-dev). About 40 s on 2 cores.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "gateway"), str(ROOT / "contract")]

from fleetllm_contract.gatewaynative import tag_of  # noqa: E402
from fleetllm_gateway.native import COMPILED, FORMAT, MANIFEST, PACKAGE  # noqa: E402


def build(target: Path, source: Path = ROOT / "gateway" / PACKAGE) -> dict[str, object]:
    """Compile `source` (a copy of the package) into `target`, which is replaced; returns the manifest."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    with tempfile.TemporaryDirectory(prefix="gateway-native-") as scratch:
        work = Path(scratch)
        shutil.copytree(source, work / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        env = {**os.environ, "MYPYPATH": str(ROOT / "contract")}
        done = subprocess.run([sys.executable, "-m", "mypyc", *(f"{PACKAGE}/{m}.py" for m in COMPILED)],
                              cwd=work, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"mypyc failed (exit {done.returncode}):\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
        runtimes = list(work.glob(f"*__mypyc{suffix}"))
        if len(runtimes) != 1:
            raise SystemExit(f"mypyc left {len(runtimes)} runtime modules in {work}, expected one")
        manifest: dict[str, object] = {
            "format": FORMAT, "suffix": suffix, "runtime": runtimes[0].name[:-len(suffix)],
            "python": sys.version.split()[0],
            "modules": {m: hashlib.sha256((source / f"{m}.py").read_bytes()).hexdigest() for m in COMPILED}}
        staged = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        staged.chmod(0o755)  # mkdtemp makes it 0700: the gateway may run as another user
        (staged / PACKAGE).mkdir()
        shutil.copy2(runtimes[0], staged / runtimes[0].name)
        for module in COMPILED:
            shutil.copy2(work / PACKAGE / f"{module}{suffix}", staged / PACKAGE / f"{module}{suffix}")
        (staged / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    if target.exists():
        shutil.rmtree(target)
    staged.rename(target)
    return manifest


def usage() -> str:
    """The two command lines of the docstring above."""
    return "\n".join(line.strip() for line in __doc__.strip().splitlines()[2:4])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if len(args) == 2 and args[0] == "--builds" and not args[1].startswith("-"):
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
        tag = tag_of(suffix)
        if tag is None:
            print(f"build_gateway_native: this Python's extension modules end in {suffix!r}, which names no tag a "
                  "box asks for: build with a CPython on Linux, or use the one-directory form", file=sys.stderr)
            return 2
        target = Path(args[1]).resolve() / tag
    elif len(args) == 1 and not args[0].startswith("-"):
        target = Path(args[0]).resolve()
    else:
        print(usage(), file=sys.stderr)
        return 2
    target.parent.mkdir(parents=True, exist_ok=True)
    manifest = build(target)
    print(f"{target}: {len(COMPILED)} modules compiled for Python {manifest['python']} ({manifest['suffix']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
