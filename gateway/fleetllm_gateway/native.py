"""The gateway's hot modules compiled (mypyc), used when a build made for this interpreter and these very
sources is there; else the same modules as Python, as always.

Why: compiled, the modules of the request path took 13 % off the first event of a streamed answer and 11
to 20 % off the CPU a request costs, on Debian's Python 3.11 (docs/benchmarks.md, "Fourteenth round"):
what the gateway leaves of a box's cores goes to vLLM's own front end.

A build is a directory (`python tools/build_gateway_native.py DIR` makes one, for the Python that runs it):

    MANIFEST.json                        {"format": 1, "suffix": ".cpython-311-x86_64-linux-gnu.so",
                                          "runtime": "<hash>__mypyc", "modules": {"app": "<sha256>", ...}}
    <hash>__mypyc<suffix>                the compiled code of every module, and mypyc's runtime
    fleetllm_gateway/<module><suffix>    one small module each, which loads its part of the above

$FLEETLLM_GATEWAY_NATIVE names it; the package's `__init__` calls `activate()` before any of its modules
is imported. The build is used only when its suffix is one this interpreter loads (same version, same
ABI), it holds every module of COMPILED, each module's source here (in a checkout, site-packages or the box
zipapp) has the sha256 the build was made from, and its runtime loads. Anything else (another Python,
another version of the gateway, a file missing or unloadable) leaves the gateway on its Python modules,
and `STATUS` says why; the gateway logs it when it starts. Standard library only, as the box program.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fleetllm_contract.gatewaynative import ENV as ENV  # re-exported: native.ENV
from fleetllm_gateway.errors import GatewayError

if TYPE_CHECKING:
    from collections.abc import Callable

MANIFEST = "MANIFEST.json"
FORMAT = 1
PACKAGE = "fleetllm_gateway"
# The request path, compiled together (calls between them are C calls). Not here: what runs once (config,
# cli, serve, workers, target, proxyenv), and errors.py, whose ConnectionError subclass mypyc cannot compile.
COMPILED = ("app", "busypoll", "client", "connection", "forwarding", "httpserver", "jsonscan", "limiter",
            "metrics", "response")


@dataclass(frozen=True)
class Status:
    """`compiled`: the build is in use. `asked`: $FLEETLLM_GATEWAY_NATIVE named one. `reason`: why it is
    not in use (empty when it is, or when none was asked for)."""

    compiled: bool
    asked: bool
    reason: str = ""


STATUS = Status(compiled=False, asked=False)


class NativeBuildError(GatewayError):
    """A build that cannot be used here; the message says why and what to do."""


def source_digest(module: str, package_dir: str) -> str:
    """sha256 of a module's source as this package holds it: a file, or a member of the box zipapp (its
    loader reads either; importlib.resources would import zipfile and tempfile into every worker)."""
    import hashlib

    loader = sys.modules[PACKAGE].__spec__.loader  # type: ignore[union-attr]
    path = os.path.join(package_dir, f"{module}.py")
    try:
        data = loader.get_data(path)  # type: ignore[union-attr]
    except OSError as exc:
        raise NativeBuildError(f"{path}: cannot be read ({exc.strerror or exc}), so no build can be checked "
                               "against it: install the gateway with its sources") from None
    return hashlib.sha256(data).hexdigest()


def read_manifest(directory: Path) -> dict[str, object]:
    """The build's MANIFEST.json as a dict of this format; NativeBuildError when it is not one."""
    import json

    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except OSError as exc:
        raise NativeBuildError(f"{directory / MANIFEST}: cannot be read ({exc.strerror or exc}): build one with "
                               "tools/build_gateway_native.py, or unset " + ENV) from None
    except (ValueError, RecursionError) as exc:
        raise NativeBuildError(f"{directory / MANIFEST}: not JSON ({exc}): build it again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise NativeBuildError(f"{directory / MANIFEST}: not a manifest of format {FORMAT}: build it again")
    return manifest


def check_contents(directory: Path, manifest: dict[str, object], digest: Callable[[str], str]) -> None:
    """NativeBuildError unless the build holds every module of COMPILED, each made from a source whose
    sha256 is `digest(module)`, and its runtime (whatever Python it was made for: the control plane
    checks the builds it serves so, check() the one a gateway runs)."""
    suffix, runtime, modules = manifest.get("suffix"), manifest.get("runtime"), manifest.get("modules")
    # The runtime's name is mypyc's hash of the modules plus `__mypyc`: it may start with a digit, so a plain
    # module name (letters, digits, `_`: no path) rather than an identifier.
    if not isinstance(suffix, str) or not isinstance(runtime, str) or not runtime.isascii() \
            or not runtime.replace("_", "").isalnum() \
            or not isinstance(modules, dict) or sorted(modules) != sorted(COMPILED):
        raise NativeBuildError(f"{directory / MANIFEST}: its runtime or modules are not this gateway's "
                               f"({', '.join(COMPILED)}): build it again")
    for module in COMPILED:
        if modules[module] != digest(module):
            raise NativeBuildError(f"{directory} was built from another {PACKAGE}/{module}.py than this one "
                                   "(another version of the gateway): build it again from these sources")
        if not (directory / PACKAGE / f"{module}{suffix}").is_file():
            raise NativeBuildError(f"{directory / PACKAGE / (module + suffix)}: missing: build it again")
    if not (directory / f"{runtime}{suffix}").is_file():
        raise NativeBuildError(f"{directory / (runtime + suffix)}: missing: build it again")


def check(directory: Path, package_dir: str) -> dict[str, object]:
    """The build's manifest, or NativeBuildError saying why the build does not fit this interpreter and
    the sources in `package_dir` (the package's own directory)."""
    manifest = read_manifest(directory)
    suffix = manifest.get("suffix")
    if suffix not in importlib.machinery.EXTENSION_SUFFIXES:
        raise NativeBuildError(f"{directory} was built for another Python (its modules end in {suffix!r}, this "
                               f"Python {sys.version.split()[0]} loads {importlib.machinery.EXTENSION_SUFFIXES[0]!r}):"
                               " build it with this Python")
    check_contents(directory, manifest, lambda module: source_digest(module, package_dir))
    return manifest


def activate(directory: str | None, package_path: list[str]) -> Status:
    """Use the build in `directory` (None or empty: none asked for) when it fits: its directory goes first
    on `package_path` (the package's __path__) and on sys.path (for its runtime), before any of COMPILED
    is imported. Sets and returns STATUS; never raises."""
    global STATUS
    if not directory:
        STATUS = Status(compiled=False, asked=False)
        return STATUS
    if already := [m for m in COMPILED if f"{PACKAGE}.{m}" in sys.modules]:
        STATUS = Status(False, True, f"{PACKAGE}.{already[0]} was imported before the build could be used")
        return STATUS
    root = Path(directory).resolve()
    try:
        manifest = check(root, package_path[0])
        sys.path.insert(0, str(root))
        try:
            importlib.import_module(str(manifest["runtime"]))
        except ImportError as exc:
            sys.path.remove(str(root))
            raise NativeBuildError(f"{root}: its runtime does not load ({exc}): build it on this machine's "
                                   "kind of system") from None
    except NativeBuildError as exc:
        STATUS = Status(False, True, str(exc))
        return STATUS
    package_path.insert(0, str(root / PACKAGE))
    STATUS = Status(compiled=True, asked=True)
    return STATUS


def activate_from_environment(package_path: list[str]) -> Status:
    return activate(os.environ.get(ENV), package_path)
