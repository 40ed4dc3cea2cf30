"""The pull-request comment's bookkeeping for action.yml: one comment per fleet directory, found again
by a hidden marker on its first line. `gh api` does the HTTP; this module only builds and finds.

    python -m fleetllm.cli.ghcomment marker FLEET_DIR          -> the marker
    python -m fleetllm.cli.ghcomment payload MARKER REPORT     -> {"body": ...} for gh api --input
    gh api --paginate --slurp .../comments | python -m fleetllm.cli.ghcomment find MARKER
                                                                  -> the comment id, or nothing
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from fleetllm.core.fleet.jsonvalue import JSON


def marker(fleet_dir: str) -> str:
    digest = hashlib.sha256(fleet_dir.encode("utf-8")).hexdigest()[:16]
    return f"<!-- fleetllm-diff {digest} -->"


def payload(mark: str, report: str) -> dict[str, JSON]:
    return {"body": f"{mark}\n{report}"}


def find(pages: JSON, mark: str) -> int | None:
    """The first comment whose body starts with the marker, in `gh api --paginate --slurp` output."""
    for page in pages if isinstance(pages, list) else []:
        for comment in page if isinstance(page, list) else []:
            if isinstance(comment, dict) and str(comment.get("body") or "").startswith(mark):
                found = comment.get("id")
                if isinstance(found, int):
                    return found
    return None


def main(argv: Sequence[str]) -> int:
    match list(argv):
        case ["marker", fleet_dir]:
            print(marker(fleet_dir))
        case ["payload", mark, report]:
            json.dump(payload(mark, Path(report).read_text(encoding="utf-8")), sys.stdout)
        case ["find", mark]:
            found = find(json.load(sys.stdin), mark)
            print("" if found is None else found)
        case _:
            print(__doc__, file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
