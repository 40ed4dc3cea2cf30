"""What docs/gen_config_reference.py and docs/gen_metrics_reference.py share: their command line, which
writes a generated reference or, with --check, says whether it is stale. Standard library only."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def shown(path: Path) -> str:
    """`path` as the messages name it: from the repository's root when it is inside."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def write_or_check(target: Path, render: Callable[[], str], description: str, argv: list[str] | None = None) -> int:
    """Rewrite `target` with `render()` (exit 0), or with --check exit 1 when it differs (0 when current)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help=f"exit 1 if {shown(target)} is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = target.read_text(encoding="utf-8") if target.exists() else ""
        if current != text:
            print(f"{shown(target)} is stale: run `make docs`", file=sys.stderr)
            return 1
        return 0
    target.write_text(text, encoding="utf-8")
    print(f"wrote {shown(target)}")
    return 0
