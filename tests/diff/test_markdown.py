"""The pull-request comment: under GitHub's size limit whatever the change, well-formed when cut."""

from __future__ import annotations

import re

import pytest

from fleetllm.core.diff import DEFAULT_MAX_CHARS, Section, diff_fleets, render_markdown, render_text
from fleetllm.core.diff.markdown import GITHUB_COMMENT_LIMIT
from fleetllm.core.fleet.jsonvalue import freeze_mapping
from fleetllm.core.fleet.model import Box, Fleet, FleetSettings, LitellmRoute, Recipe, ServerRow, VllmRecipe, frozen_map

MODELS = [f"model-{i}" for i in range(40)]


def recipe(name: str, context: int, note: str = "") -> Recipe:
    return Recipe(name, VllmRecipe(model=f"org/{name}", served_model_name=name, max_model_len=32768),
                  LitellmRoute(model_info=freeze_mapping({"context_window": context, "note": note})))


def big_fleet(revision: str, shift: int, context: int, boxes: int = 2000) -> Fleet:
    placed = {}
    for i in range(boxes):
        name = f"10.0.{i // 250}.{i % 250}"
        rows = tuple(ServerRow(MODELS[(i + slot + shift) % len(MODELS)], 8001 + slot, f"s{slot}") for slot in range(3))
        placed[name] = Box(name, rows)
    return Fleet(revision, FleetSettings(), frozen_map({m: recipe(m, context) for m in MODELS}),
                 frozen_map(placed))


def well_formed(markdown: str) -> None:
    lines = markdown.splitlines()
    assert sum(line.startswith("<details>") for line in lines) == lines.count("</details>")
    fences = [line for line in lines if line.startswith("```")]
    assert len(fences) % 2 == 0
    assert not markdown.rstrip().endswith(("```diff", "<details>"))


def test_a_huge_change_is_cut_under_the_limit_with_a_note() -> None:
    report = diff_fleets(big_fleet("a" * 40, 0, 16384), big_fleet("b" * 40, 1, 32768))
    assert len(render_text(report)) > 5 * GITHUB_COMMENT_LIMIT  # the change really is huge
    markdown = render_markdown(report)
    assert len(markdown) <= DEFAULT_MAX_CHARS < GITHUB_COMMENT_LIMIT
    well_formed(markdown)
    assert markdown.startswith("**fleetllm diff** `aaaaaaaaaaaa`..`bbbbbbbbbbbb`: 2000 boxes must restart vLLM")
    note = markdown.rstrip().splitlines()[-1]
    match = re.fullmatch(r"\*\*Truncated:\*\* (\d+) of (\d+) report lines are not shown, .*", note)
    assert match and 0 < int(match[1]) < int(match[2])
    assert "fleetllm diff aaaaaaaaaaaa bbbbbbbbbbbb" in note


@pytest.mark.parametrize("limit", [600, 1500, 4000, 20000])
def test_any_limit_keeps_the_comment_well_formed(limit: int) -> None:
    report = diff_fleets(big_fleet("a" * 40, 0, 16384, boxes=200), big_fleet("b" * 40, 1, 32768, boxes=200))
    markdown = render_markdown(report, max_chars=limit)
    assert len(markdown) <= limit
    well_formed(markdown)
    assert markdown.splitlines()[0].startswith("**fleetllm diff**") and "**Truncated:**" in markdown


def test_a_small_change_is_not_cut() -> None:
    a = big_fleet("a" * 40, 0, 16384, boxes=3)
    b = Fleet("b" * 40, a.settings, frozen_map({**a.recipes, "model-1": recipe("model-1", 8192)}), a.boxes)
    markdown = render_markdown(diff_fleets(a, b))
    well_formed(markdown)
    assert "Truncated" not in markdown
    assert "! 10.0.0.0:8002 model-1 will be updated" in markdown  # `~` shown as `!`: GitHub colours it


def test_backticks_in_a_value_cannot_close_the_code_block() -> None:
    a = big_fleet("a" * 40, 0, 16384, boxes=1)
    b = Fleet("b" * 40, a.settings, frozen_map({**a.recipes, "model-0": recipe("model-0", 16384, "``` </details>")}),
              a.boxes)
    markdown = render_markdown(diff_fleets(a, b))
    assert "\n````diff\n" in markdown and "\n````\n" in markdown
    well_formed(markdown)


def test_outages_come_first_and_extra_sections_are_rendered() -> None:
    a = big_fleet("a" * 40, 0, 16384, boxes=2)
    b = Fleet("b" * 40, a.settings, a.recipes, frozen_map({"10.0.0.0": a.boxes["10.0.0.0"]}))
    plan = Section("Plan against the live fleet", "Plan: 1 to destroy", ("- example",))
    markdown = render_markdown(diff_fleets(a, b), extra=[plan])
    lines = markdown.splitlines()
    assert lines[2] == "> [!CAUTION]" and lines[3].startswith("> **Outage:** model model-3 loses its last server")
    assert "<details><summary>Plan: 1 to destroy</summary>" in markdown


def with_allowed(fleet: Fleet, model: str, args: tuple[str, ...], allow: frozenset[str], revision: str) -> Fleet:
    old = fleet.recipes[model]
    vllm = VllmRecipe(model=old.vllm.model, served_model_name=old.vllm.served_model_name, args=args,
                      max_model_len=old.vllm.max_model_len, allow_options=allow)
    recipes = {**fleet.recipes, model: Recipe(model, vllm, old.litellm)}
    return Fleet(revision, fleet.settings, frozen_map(recipes), fleet.boxes)


def test_a_newly_allowed_risky_option_is_listed_at_the_top_outside_collapsed_sections() -> None:
    base = big_fleet("a" * 40, 0, 32768)
    head = with_allowed(big_fleet("b" * 40, 1, 16384), "model-7", ("--trust-remote-code",),
                        frozenset({"trust-remote-code", "chat-template"}), "b" * 40)
    markdown = render_markdown(diff_fleets(base, head))
    top = markdown.split("<details>", 1)[0]
    assert "**Newly allowed vLLM options**" in top
    assert "> - `model-7`: --trust-remote-code (used at HEAD; " in top
    assert "> - `model-7`: --chat-template (allowed, not yet used; " in top
    assert "Truncated" in markdown  # cut for size, the list still on top
    assert "--trust-remote-code (used at HEAD" in render_text(diff_fleets(base, head))
    # Allowed already at BASE: not listed again.
    again = with_allowed(head, "model-7", ("--trust-remote-code",), frozenset({"trust-remote-code",
                                                                              "chat-template"}), "c" * 40)
    assert "Newly allowed" not in render_markdown(diff_fleets(head, again))
