"""The shell blocks of the user-facing docs, and what each is: run by a test, or an example with a reason.

Every fenced shell block (```sh, ```bash, ```shell, ```console, at any indentation) of the documents in
DOCUMENTS is preceded by one HTML comment, which Markdown renders as nothing:

    <!-- doc-test: run -->                  tests/docblocks/test_run.py runs it against a running demo
    <!-- doc-test: example: REASON -->      not run, for the REASON given (a real account, a proxy, ...)

A block run by the test may be followed by a text block marked `<!-- doc-test: output -->`: the output
the doc shows for it, compared line by line (a line `...` stands for any number of lines; each other line
must match the next output line after the normalisations of `normalise`). A text block marked
`<!-- doc-test: demo-output -->` is compared the same way with what `fleetllm demo` printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = (ROOT / "README.md", ROOT / "docs" / "quickstart.md", ROOT / "docs" / "runbooks.md")
SHELL = ("sh", "bash", "shell", "console")
FENCE = re.compile(r"^( *)```(\w*)[^\n]*\n(.*?)^\1```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"<!-- doc-test: ([^>]*?) -->\s*\Z")


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str  # the block's content, its indentation removed
    marker: str | None  # the comment's words ("run", "example: ...", "output", ...) or None

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT) if self.doc.is_relative_to(ROOT) else self.doc}:{self.line}"

    @property
    def shell(self) -> bool:
        return self.lang in SHELL

    @property
    def kind(self) -> str | None:
        return None if self.marker is None else self.marker.split(":")[0].strip()


def blocks(doc: Path, text: str | None = None) -> list[Block]:
    """The fenced blocks of `doc`, each with the doc-test marker on the lines just above it."""
    source = doc.read_text() if text is None else text
    found = []
    for match in FENCE.finditer(source):
        indent, lang, body = match.group(1), match.group(2), match.group(3)
        before = source[:match.start()].rstrip()
        marker = MARKER.search(before)
        lines = [line.removeprefix(indent) for line in body.splitlines()]
        found.append(Block(doc, source.count("\n", 0, match.start()) + 1, lang, "\n".join(lines) + "\n",
                           marker.group(1).strip() if marker else None))
    return found


def unmarked(doc: Path, text: str | None = None) -> list[str]:
    """What is wrong with the markers of `doc`'s shell blocks: one line per block."""
    problems = []
    for block in blocks(doc, text):
        if not block.shell:
            continue
        if block.kind not in ("run", "example"):
            problems.append(f"{block.where}: a ```{block.lang} block without <!-- doc-test: run --> or "
                            "<!-- doc-test: example: REASON --> above it")
        elif block.kind == "example" and not (block.marker or "").partition(":")[2].strip():
            problems.append(f"{block.where}: an example without a reason (<!-- doc-test: example: REASON -->)")
    return problems


def outputs(doc: Path) -> list[tuple[Block, Block]]:
    """(run block, its output block) for every block marked `output`, which must follow a run block."""
    pairs = []
    previous: Block | None = None
    for block in blocks(doc):
        if block.kind == "output":
            assert previous is not None and previous.kind == "run", f"{block.where}: output of no run block"
            pairs.append((previous, block))
        previous = block
    return pairs


HEX = re.compile(r"\b[0-9a-f]{12}\b")


def normalise(line: str, replacements: dict[str, str]) -> str:
    """One output line as the docs show it: the run's own values (scratch directory, addresses, ports)
    replaced by the docs' examples, and every 12-digit revision by <rev>."""
    for real, shown in replacements.items():
        line = line.replace(real, shown)
    return HEX.sub("<rev>", line.rstrip())


def mismatch(shown: str, actual: str, replacements: dict[str, str]) -> str | None:
    """None when `actual` (a command's output) has the lines `shown` (a doc's output block), in order, with
    `...` for any number of lines; else the first line that does not match and what was there."""
    want = [normalise(line, {}) for line in shown.splitlines()]
    have = [normalise(line, replacements) for line in actual.splitlines()]
    position, skipping = 0, False
    for line in want:
        if line.strip() == "...":
            skipping = True
            continue
        if skipping:
            while position < len(have) and have[position] != line:
                position += 1
        if position >= len(have) or have[position] != line:
            there = have[position] if position < len(have) else "(end of output)"
            return f"the docs show {line!r}; the output has {there!r}"
        position, skipping = position + 1, False
    return None
