"""The risky-option list (fleetllm.core.fleet.options) against vLLM's real `serve` parser: every listed option
exists, every spelling vLLM reads as one of them (prefixes, `_` for `-`, `=value`, single-dash aliases) is
matched, and the full name of every other option is not (so the rule cannot pass by matching everything).

Needs only the harness's venv (nothing is served)."""

from __future__ import annotations

import pytest

from fleetllm.core.fleet.options import NOT_ABBREVIATIONS, RISKY_OPTIONS, SHORT_ALIASES, risky_option
from tests.realvllm.harness import Harness
from tests.realvllm.test_managed_flags_parser import probe, spellings

pytestmark = [pytest.mark.realvllm]


@pytest.fixture(scope="module")
def options(harness: Harness) -> dict[str, list[str]]:
    found: dict[str, list[str]] = probe(harness, "options")
    return found


def dest(option: str, options: dict[str, list[str]]) -> str:
    return next(d for d, strings in options.items() if option in strings)


def test_every_risky_option_is_a_real_option(options: dict[str, list[str]]) -> None:
    strings = {s for group in options.values() for s in group}
    assert sorted(o for o in RISKY_OPTIONS if f"--{o}" not in strings) == []
    assert all(f"-{alias}" in options[dest(f"--{long}", options)] for alias, long in SHORT_ALIASES.items())
    shorts = {s[1:] for s in strings if not s.startswith("--")}
    risky_shorts = {s[1:] for o in RISKY_OPTIONS for s in options[dest(f"--{o}", options)] if not s.startswith("--")}
    assert risky_shorts == set(SHORT_ALIASES) and risky_shorts <= shorts


def test_names_that_are_prefixes_of_risky_ones_are_listed(options: dict[str, list[str]]) -> None:
    names = {s[2:] for group in options.values() for s in group if s.startswith("--")}
    prefixes = {n for n in names if n not in RISKY_OPTIONS and any(r != n and r.startswith(n) for r in RISKY_OPTIONS)}
    assert prefixes == set(NOT_ABBREVIATIONS)
    flagged = sorted(n for n in names if n not in RISKY_OPTIONS and risky_option(f"--{n}") is not None)
    assert flagged == []


def test_every_spelling_vllm_reads_as_a_risky_option_is_matched(harness: Harness,
                                                                 options: dict[str, list[str]]) -> None:
    cases: list[tuple[str, list[str]]] = []
    for option in sorted(RISKY_OPTIONS):
        for string in options[dest(f"--{option}", options)]:
            for spelled in spellings(string):
                cases += [(option, [spelled, "x"]), (option, [f"{spelled}=x"])]
    results = probe(harness, "parse", [tokens for _, tokens in cases])
    read: list[tuple[str, list[str]]] = []
    for (option, tokens), result in zip(cases, results, strict=True):
        if "set" in result and dest(f"--{option}", options) in result["set"]:
            read.append((option, tokens))
    assert len(read) > 200
    missed = [" ".join(tokens) for option, tokens in read if risky_option(tokens[0]) != option]
    assert missed == []
