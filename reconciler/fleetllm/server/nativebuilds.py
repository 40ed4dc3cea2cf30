"""The box gateway's compiled builds a box fetches at GET /vllm/gateway-native/<tag>, loaded once at start-up.

The directory server.gateway_native names (fleetllm.settings) holds one build per subdirectory, each made
by tools/build_gateway_native.py for one kind of Python (fleetllm_gateway.native). A build is served only
when its manifest is one the gateway reads, its suffix gives a tag a box can ask for
(fleetllm_contract.gatewaynative.tag_of), and it was made from the very gateway sources this control plane
bundles into the box program it serves at GET /vllm/installer: a box runs the gateway of that program, and
a build of other sources would be refused on the box anyway. Each is packed once into a gzipped tar whose
bytes depend on the build's files alone (sorted members, no time, no owner), so every replica serves the
same bytes and sha256 (the ETag) for the same build.

A build that cannot be served is refused with its reason, logged at start-up, and never stops it: the
boxes of that Python then run the gateway's Python modules, as they did before builds were served.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import logging
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from fleetllm.logs import get_logger, log_event
from fleetllm_contract.gatewaynative import MAX_ARCHIVE_BYTES, tag_of
from fleetllm_gateway.native import (
    COMPILED,
    MANIFEST,
    PACKAGE,
    NativeBuildError,
    check_contents,
    read_manifest,
    source_digest,
)
from fleetllm_installer.zipapp import package_dir

log = get_logger("runtime")


@dataclass(frozen=True)
class GatewayBuild:
    """One build as boxes get it: its tag, the archive and the archive's sha256 (hex)."""

    tag: str
    directory: Path
    body: bytes = field(repr=False)  # about 1 MB: not in a repr (a test's failure, a debugger)
    sha256: str

    @property
    def etag(self) -> str:
        return f'"{self.sha256}"'


@dataclass(frozen=True)
class RefusedBuild:
    """A subdirectory of the builds directory that is not served, and why (what to do included)."""

    directory: Path
    reason: str


@dataclass(frozen=True)
class GatewayBuilds:
    """The builds this control plane serves (sorted by tag) and the ones it refused, from `directory`
    (None: no builds directory)."""

    directory: Path | None
    builds: tuple[GatewayBuild, ...] = ()
    refused: tuple[RefusedBuild, ...] = ()

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(build.tag for build in self.builds)

    def get(self, tag: str) -> GatewayBuild | None:
        return next((build for build in self.builds if build.tag == tag), None)


def source_digests() -> dict[str, str]:
    """sha256 of each compiled module's source, read where the served box program takes the gateway from
    (the zipapp's package_dir); NativeBuildError when a source cannot be read."""
    where = package_dir(PACKAGE)
    if where is None:
        raise NativeBuildError(f"this Python cannot find the import package {PACKAGE}, so no build can be checked "
                               "against its sources: reinstall fleetllm")
    return {module: source_digest(module, str(where)) for module in COMPILED}


def members(manifest: dict[str, object]) -> list[str]:
    """The files of a checked build (check_contents), relative to its directory: all that is packed."""
    suffix, runtime = str(manifest["suffix"]), str(manifest["runtime"])
    return [MANIFEST, f"{runtime}{suffix}", *(f"{PACKAGE}/{module}{suffix}" for module in COMPILED)]


def read_member(directory: Path, name: str) -> bytes:
    """A member's bytes; NativeBuildError for a symbolic link (its target could be any file of this
    machine, served to every box) or anything but a regular file."""
    path = directory / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        if os.path.islink(path):
            raise NativeBuildError(f"{path}: a symbolic link: copy the file it points to into the build") from None
        raise NativeBuildError(f"{path}: cannot be read ({exc.strerror or exc}): build it again") from None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise NativeBuildError(f"{path}: not a regular file: build it again")
        return file.read()


def pack(directory: Path, manifest: dict[str, object]) -> bytes:
    """The build as a gzipped tar of exactly its members: sorted, every time 0, owner root with no names,
    files 0644 and the package directory 0755, so that the bytes depend on the files' contents alone."""
    package = directory / PACKAGE
    if not stat.S_ISDIR(os.lstat(package).st_mode):
        raise NativeBuildError(f"{package}: not a directory (a symbolic link?): build it again")
    buffer = io.BytesIO()
    # Level 6: a CPython 3.11 build packs in a quarter of level 9's time (0.12 s, not 0.47 s), 0.6 % larger.
    with gzip.GzipFile(filename="", mode="wb", compresslevel=6, fileobj=buffer, mtime=0) as compressed, \
            tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name in sorted([PACKAGE, *members(manifest)]):  # the directory before its files
            if name == PACKAGE:
                archive.addfile(entry(name, tarfile.DIRTYPE, 0o755))
                continue
            data = read_member(directory, name)
            archive.addfile(entry(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
    return buffer.getvalue()


def entry(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size = kind, mode, size
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def load_build(directory: Path, digests: dict[str, str]) -> GatewayBuild:
    """The build in `directory`, checked and packed; NativeBuildError saying why it cannot be served."""
    manifest = read_manifest(directory)
    suffix = manifest.get("suffix")
    tag = tag_of(suffix) if isinstance(suffix, str) else None
    if tag is None:  # before any path is made of the suffix: a tag holds no "/" nor ".."
        raise NativeBuildError(f"{directory / MANIFEST}: its suffix {str(suffix)[:80]!r} is not one a box asks for "
                               "(.<tag>.so, such as .cpython-311-x86_64-linux-gnu.so): build it with a CPython on "
                               "Linux")
    check_contents(directory, manifest, digests.__getitem__)
    body = pack(directory, manifest)
    if len(body) > MAX_ARCHIVE_BYTES:
        raise NativeBuildError(f"{directory}: packed, it is {len(body)} bytes, more than a box takes "
                               f"({MAX_ARCHIVE_BYTES}): build it again without debug information")
    return GatewayBuild(tag, directory, body, hashlib.sha256(body).hexdigest())


def load_gateway_builds(directory: Path | None) -> GatewayBuilds:
    """The builds of `directory` (server.gateway_native), each subdirectory checked against this control
    plane's gateway sources and packed, in the order of their names (so that of two builds for one tag,
    every replica serves the same one). Logged once: the tags served, and each refused build with its
    reason at WARNING. Never raises for a build: a refused one is left out."""
    builds: dict[str, GatewayBuild] = {}
    refused: list[RefusedBuild] = []
    if directory is not None:
        try:
            entries = sorted(directory.iterdir())
            digests = source_digests()
        except OSError as exc:
            entries, digests = [], {}
            refused.append(RefusedBuild(directory, f"{directory}: cannot be read ({exc.strerror or exc}): "
                                                   "make it readable by the control plane's user"))
        except NativeBuildError as exc:
            entries, digests = [], {}
            refused.append(RefusedBuild(directory, str(exc)))
        for path in entries:
            if path.name.startswith("."):
                continue
            try:
                if not path.is_dir():
                    raise NativeBuildError(f"{path}: not a directory: each build is a subdirectory of "
                                           f"{directory} (tools/build_gateway_native.py makes one); move the "
                                           "file elsewhere")
                build = load_build(path, digests)
                if build.tag in builds:
                    raise NativeBuildError(f"{path}: a build for {build.tag} too, and {builds[build.tag].directory} "
                                           "is served for it: remove one of the two")
            except (NativeBuildError, OSError) as exc:
                refused.append(RefusedBuild(path, str(exc) if isinstance(exc, NativeBuildError)
                                            else f"{path}: cannot be read ({exc.strerror or exc}): make it "
                                            "readable by the control plane's user"))
                continue
            builds[build.tag] = build
    loaded = GatewayBuilds(directory, tuple(sorted(builds.values(), key=lambda b: b.tag)), tuple(refused))
    log_event(log, "gateway native builds", directory=str(directory) if directory is not None else None,
              tags=list(loaded.tags), bytes={b.tag: len(b.body) for b in loaded.builds}, refused=len(refused))
    for each in loaded.refused:
        log_event(log, "gateway native build refused", logging.WARNING, directory=str(each.directory),
                  reason=each.reason)
    return loaded
