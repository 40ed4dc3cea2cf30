"""Every shell block of README.md, docs/quickstart.md and docs/runbooks.md is marked as run or as an
example with a reason (tests/docblocks/blocks.py), and the comparison of shown output can fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docblocks.blocks import DOCUMENTS, ROOT, blocks, mismatch, outputs, unmarked


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shell_block_is_run_or_an_example(doc: Path) -> None:
    assert unmarked(doc) == []
    for run, output in outputs(doc):  # an output block follows the block it shows the output of
        assert run.kind == "run" and output.lang == "text", output.where


def test_the_quickstart_and_the_runbooks_run_blocks() -> None:
    runs = {doc.name: [b for b in blocks(doc) if b.kind == "run"] for doc in DOCUMENTS}
    assert runs["quickstart.md"] and len(runs["runbooks.md"]) >= 5
    assert outputs(ROOT / "docs" / "quickstart.md")


def test_an_unmarked_block_an_indented_one_and_an_example_without_reason_are_found(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("# t\n\n```sh\nfleetllm validate\n```\n\n1. step\n\n   ```bash\n   make demo\n   ```\n\n"
                   "<!-- doc-test: example: -->\n```sh\nls\n```\n\n<!-- doc-test: run -->\n```sh\nls\n```\n\n"
                   "```text\nnot shell\n```\n")
    problems = unmarked(doc)
    assert [p.split(": ")[0].rsplit(":", 1)[1] for p in problems] == ["3", "9", "14"]
    assert "without a reason" in problems[2]
    assert [b.text for b in blocks(doc) if b.lang == "bash"] == ["make demo\n"]


def test_shown_output_is_compared() -> None:
    actual = "fleetllm diff aaaaaaaaaaaa..bbbbbbbbbbbb\nheader\nmiddle\nwave 1:\n  10.0.0.9: starts x\n"
    shown = "fleetllm diff 13e8b6020ab3..5d0c7f1a9e42\n...\nwave 1:\n  127.0.0.2: starts x\n"
    assert mismatch(shown, actual, {"10.0.0.9": "127.0.0.2"}) is None
    assert "127.0.0.2: starts y" in (mismatch(shown.replace("starts x", "starts y"), actual,
                                              {"10.0.0.9": "127.0.0.2"}) or "")
    assert mismatch("header\nwave 1:\n", actual, {}) is not None  # without `...` the lines must be adjacent
    assert mismatch("wave 2:\n", actual, {}) is not None
