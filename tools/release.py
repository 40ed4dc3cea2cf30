"""What a release is called, from the one version (contract/fleetllm_contract/version.py). Standard library
only: .github/workflows/release.yml runs it before anything is installed.

    python tools/release.py outputs --ref REF --repository OWNER/NAME [--tags TAG ...]
        key=value lines for $GITHUB_OUTPUT: version, tag (v<version>), major (v<major>), image
        (ghcr.io/<owner>/<name>, lower case), move_major (true when this version is the newest of its
        major among --tags, so v1 never moves back to an older 1.x). Exit 1 when REF is a tag other
        than v<version>: the tag and the source must name the same release.
    python tools/release.py notes [--changelog CHANGELOG.md]
        the CHANGELOG.md section of this version (empty when it has none)
"""

from __future__ import annotations

import argparse
import re
import runpy
import sys
from collections.abc import Iterable, Sequence
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/release.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    out = sub.add_parser("outputs")
    out.add_argument("--ref", required=True)
    out.add_argument("--repository", required=True)
    out.add_argument("--tags", nargs="*", default=[])
    log = sub.add_parser("notes")
    log.add_argument("--changelog", type=Path, default=ROOT / "CHANGELOG.md")
    args = parser.parse_args(argv)
    try:
        if args.command == "outputs":
            print("\n".join(f"{k}={v}" for k, v in outputs(args.ref, args.repository, args.tags).items()))
        else:
            sys.stdout.write(notes(args.changelog))
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
