"""The box gateway's compiled modules on the box: fetched for the Python that runs the gateway, unpacked
beside its program, named to it by FLEETLLM_GATEWAY_NATIVE (fleetllm_gateway.native).

The control plane serves a build per kind of Python (GET /vllm/gateway-native/<tag>,
fleetllm_contract.gatewaynative). Each build the box holds is a directory of
$DATA/fleetllm/gateway/native/ named by the sha256 of the archive it came from: a new build is a new
directory (so a running gateway's files never change under it) and the names are the ETags the next
fetch sends, which the control plane answers 304 (naming the one) while it serves a build the box holds.
A build's modification time says when it was last named in the gateway's program (a fetched one starts
at 0), so the box knows the build in use without reading its Supervisor program.

Nothing here can stop an install: no build for this Python (404), a control plane that does not answer,
an archive that is not a clean build all leave the gateway on its Python modules, and the note says why;
a build the box already holds is kept when the control plane cannot be asked. Whether the build fits
(this very gateway's sources, this Python, a runtime that loads) is the gateway's own check, which
`--check` runs before the build is named in the gateway's program (boxgateway.check_config).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from fleetllm_contract.gatewaynative import tag_of
from fleetllm_installer.fetch import Client, FetchError

MAX_MEMBERS = 64  # a build has a manifest, a runtime and one small module per compiled module
MAX_UNPACKED = 64 * 1024 * 1024  # a build for CPython 3.11 on x86_64 is 2.8 MB
MEMBER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # no `..`, no hidden file, no path
DIGEST = re.compile(r"[0-9a-f]{64}")
STAGING = ".unpack-"


@dataclass(frozen=True)
class Fetched:
    """The build to name in the gateway's program (None: its Python modules), and what happened; `held`,
    the build the box held for the same Python when a new one came: the gateway runs that one if the new
    one does not fit (a control plane of a newer version serves builds of newer gateway sources than
    the box program a box runs until it is provisioned again)."""

    directory: Path | None
    note: str
    held: Path | None = None


def _tag(build: Path) -> str | None:
    try:
        manifest = json.loads((build / "MANIFEST.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    suffix = manifest.get("suffix") if isinstance(manifest, dict) else None
    return tag_of(suffix) if isinstance(suffix, str) else None


def _builds(root: Path) -> list[Path]:
    """The builds the box holds, the one last chosen first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if DIGEST.fullmatch(p.name) and p.is_dir() and not p.is_symlink()]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def unpack(body: bytes, target: Path) -> None:
    """Unpack a build's archive into `target` (created). Only regular files and directories, at most two
    levels deep, of plain names; at most MAX_MEMBERS of them and MAX_UNPACKED bytes, checked on each
    header before its data is read. Raises ValueError naming the first member that breaks a rule (and
    tarfile's, gzip's or zlib's errors for a damaged archive)."""
    target.mkdir(mode=0o755)
    total = 0
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as archive:
        for count, member in enumerate(archive, 1):
            if count > MAX_MEMBERS:
                raise ValueError(f"more than {MAX_MEMBERS} members")
            parts = member.name.split("/")
            if len(parts) > 2 or not all(MEMBER.fullmatch(part) for part in parts):
                raise ValueError(f"member {member.name[:100]!r} is not a plain name of at most two levels")
            path = target.joinpath(*parts)
            if member.isdir():
                path.mkdir(mode=0o755, exist_ok=True)
                continue
            if not member.isfile():
                raise ValueError(f"member {member.name!r} is not a regular file")
            total += member.size
            if total > MAX_UNPACKED:
                raise ValueError(f"more than {MAX_UNPACKED // (1024 * 1024)} MiB unpacked")
            source = archive.extractfile(member)
            assert source is not None  # a regular file's
            path.parent.mkdir(mode=0o755, exist_ok=True)
            with path.open("xb") as out:  # "x": a member twice is refused
                shutil.copyfileobj(source, out)
            path.chmod(0o644)


def fetch(client: Client, root: Path, tag: str) -> Fetched:
    """The build for `tag` (one conditional GET), unpacked under `root`; never raises for what the
    control plane answers or holds."""
    known = [build for build in _builds(root) if _tag(build) == tag]  # the one in use first
    have = known[0] if known else None
    etags = ", ".join(f'"{build.name}"' for build in known) or None
    try:
        answer = client.fetch_gateway_native(tag, etags)
    except FetchError as exc:
        if have is not None:
            return Fetched(have, f"kept the compiled gateway {have.name[:12]} for {tag}: {exc}")
        return Fetched(None, f"no compiled gateway for {tag}: {exc}")
    if answer is None:
        return Fetched(None, f"the control plane has no compiled gateway for {tag}")
    if answer.status == 304:  # one the box holds (a 304 answers only the ETags sent): the answer's says which
        served = next((build for build in known if f'"{build.name}"' == answer.etag), known[0])
        return Fetched(served, f"compiled gateway {served.name[:12]} for {tag}: unchanged",
                       have if have != served else None)
    digest = hashlib.sha256(answer.body).hexdigest()
    target = root / digest
    if not target.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=STAGING, dir=root))
        try:
            unpack(answer.body, staging / "build")
            os.utime(staging / "build", (0, 0))  # not in use yet: chosen() marks the one the gateway runs
            (staging / "build").rename(target)
        except (ValueError, OSError, EOFError, tarfile.TarError, zlib.error) as exc:
            if have is not None:
                return Fetched(have, f"kept the compiled gateway {have.name[:12]} for {tag}: the new one is not "
                                     f"usable: {exc}")
            return Fetched(None, f"the compiled gateway for {tag} is not usable: {exc}")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return Fetched(target, f"fetched the compiled gateway {digest[:12]} for {tag} ({len(answer.body)} bytes)",
                   have if have != target else None)


def chosen(build: Path) -> None:
    """Mark `build` as the one named in the gateway's program: builds are ordered by this time."""
    os.utime(build)


def prune(root: Path, keep: Path | None) -> list[Path]:
    """Remove the builds other than `keep` and the one chosen before it (the running gateway may still use
    it until Supervisor restarts it on its new program), and any unpacking left over. Returns them."""
    others = [build for build in _builds(root) if build != keep]
    removed = others[1:]
    if root.is_dir():
        removed += [p for p in root.iterdir() if p.name.startswith(STAGING)]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed
