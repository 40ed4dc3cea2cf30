"""Build the single-file box program: a zipapp of the box contract, the installer and the gateway.

Each package is taken from where Python imports it (a wheel's site-packages, or a checkout's
contract/, installer/ and gateway/ through the editable install), never from a path of the checkout.

The control plane serves it at GET /vllm/installer with its sha256, so a box always runs the
installer of the control plane it talks to. Standard library only; the build is reproducible (fixed
timestamps and order), so the same sources always give the same sha256.

    python3 fleetllm-box.pyz [installer args...]       -> fleetllm_installer.main.main
    python3 fleetllm-box.pyz gateway [gateway args...]  -> fleetllm_gateway.cli.main
    python3 -S fleetllm-box.pyz agent [--once]          -> fleetllm_installer.agent.main (the box agent)
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import zipfile
from pathlib import Path

from fleetllm_installer.errors import InstallerError

PACKAGES = ("fleetllm_contract", "fleetllm_installer", "fleetllm_gateway")
_FIXED_TIME = (2020, 1, 1, 0, 0, 0)

MAIN = '''\
import sys

if len(sys.argv) > 1 and sys.argv[1] == "gateway":
    from fleetllm_gateway.cli import main as gateway_main
    raise SystemExit(gateway_main(sys.argv[2:]))
if len(sys.argv) > 1 and sys.argv[1] == "agent":
    from fleetllm_installer.agent import main as agent_main
    raise SystemExit(agent_main(sys.argv[2:]))
from fleetllm_installer.main import main
raise SystemExit(main(sys.argv[1:]))
'''


def package_dir(package: str) -> Path | None:
    """Where an import package's sources are (a source tree or site-packages), without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _sources() -> list[tuple[str, bytes]]:
    files = [("__main__.py", MAIN.encode())]
    for package in PACKAGES:
        base = package_dir(package)
        if base is None or not base.is_dir():
            # A box program without one of them would fail on the box, far from the cause.
            raise InstallerError(f"the box program needs the import package {package} and this Python cannot "
                                 "find it: reinstall fleetllm (pip install fleetllm; in a checkout, make venv)")
        for path in sorted(base.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            files.append((f"{package}/{path.relative_to(base).as_posix()}", path.read_bytes()))
    return files


def build_zipapp_bytes() -> bytes:
    """The zipapp's bytes, built from the installed packages."""
    buffer = io.BytesIO()
    buffer.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in _sources():
            info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return buffer.getvalue()


def build_zipapp(target: Path) -> str:
    """Write the zipapp to `target` (mode 0755) and return its sha256 hex digest."""
    data = build_zipapp_bytes()
    target.write_bytes(data)
    target.chmod(0o755)
    return hashlib.sha256(data).hexdigest()


if __name__ == "__main__":
    import sys

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "fleetllm-box.pyz")
    print(f"{build_zipapp(out)}  {out}")
