"""Golden reports: each scenario is committed on a branch of a real git repository built from the
example fleet, `fleetllm diff` runs against it with its defaults (merge base with main, HEAD), and the
text and JSON reports must equal the files in golden/ exactly (revisions replaced by <base>, <head>).

To regenerate after an intended change: FLEETLLM_UPDATE_GOLDEN=1 pytest tests/diff/test_golden.py,
then read every changed file before committing it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetllm.cli.main import main
from tests.conftest import git
from tests.diff.scenarios import SCENARIOS, branch_with

GOLDEN = Path(__file__).parent / "golden"


def normalise(text: str, base: str, head: str) -> str:
    return text.replace(base, "<base>").replace(base[:12], "<base>").replace(head, "<head>").replace(
        head[:12], "<head>")


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("fmt", ["text", "json", "markdown"])
def test_report_matches_golden(scenario: str, fmt: str, fleet_git: Path, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    base = git(fleet_git, "rev-parse", "main")
    head = branch_with(fleet_git, scenario, SCENARIOS[scenario])
    monkeypatch.chdir(fleet_git)
    code = main(["diff", "--format", fmt])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    actual = normalise(out, base, head)
    path = GOLDEN / f"{scenario}.{ {'text': 'txt', 'json': 'json', 'markdown': 'md'}[fmt] }"
    if os.environ.get("FLEETLLM_UPDATE_GOLDEN"):
        path.write_text(actual)
    assert actual == path.read_text()
