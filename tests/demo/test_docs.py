"""The docs stay true: the configuration reference matches the schemas, every relative link and anchor
resolves, and every `fleetllm` and `make` command they show exists with the options it is given."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
import sys
from pathlib import Path
from types import ModuleType

import pytest

from fleetllm.cli.main import build_parser
from tests.conftest import ROOT

DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "contract" / "README.md",
               ROOT / "installer" / "README.md", ROOT / "gateway" / "README.md", ROOT / "CONTRIBUTING.md"])
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^ *```(\w*)\n(.*?)^ *```", re.S | re.M)  # indented too: the runbooks' steps
INLINE = re.compile(r"`([^`\n]+)`")


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_config_reference", ROOT / "docs" / "gen_config_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_configuration_reference_is_generated_from_the_current_schemas() -> None:
    assert (ROOT / "docs" / "configuration.md").read_text() == generator().render(), \
        "docs/configuration.md is stale: run `make docs`"


def test_the_reference_has_every_key_of_every_schema() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    for key in ("repo.approve.target", "secrets.vllm_api_salt", "reconcile.max_delete_fraction",
                "models.<model>.vllm.kv_bytes_per_token", "hosts.<box>.gateway", "legacy_servers[].port"):
        assert f"| `{key}` |" in text
    assert generator().main(["--check"]) == 0


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(doc: Path) -> None:
    for target in LINK.findall(FENCE.sub("", doc.read_text())):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        assert file.exists(), f"{doc.relative_to(ROOT)}: link to {target}: no such file"
        if anchor and file.suffix == ".md":
            assert anchor in anchors(file), f"{doc.relative_to(ROOT)}: link to {target}: no such heading"


def commands(doc: Path) -> list[str]:
    """Command lines the doc shows: lines of shell blocks, and inline code spans, that run a tool."""
    text = doc.read_text()
    lines = [line for lang, block in FENCE.findall(text) if lang in ("sh", "bash", "")
             for line in block.splitlines()]
    lines += INLINE.findall(FENCE.sub("", text))
    return [line.strip().removeprefix("$ ") for line in lines]


def subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser(full=True)._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_fleetllm_command_shown_exists_with_its_options(doc: Path) -> None:
    parsers = subcommands()
    for line in commands(doc):
        words = line.split("#")[0].split()
        if (not words or Path(words[0]).name != "fleetllm" or len(words) < 2 or words[1].startswith("-")
                or words[1].isupper()):  # `fleetllm COMMAND --help`: a placeholder
            continue
        name = words[1]
        assert name.replace("-", "_") in {p.replace("-", "_") for p in parsers}, f"{doc.name}: `{line}`: no command"
        known = {option for action in parsers[name]._actions for option in action.option_strings}
        for word in words[2:]:
            option = word.split("=")[0].strip("[]|.")
            if option.startswith("--"):
                assert option in known, f"{doc.name}: `{line}`: {name} has no option {option}"


@pytest.mark.parametrize("doc", [ROOT / "README.md", *(ROOT / "docs").glob("*.md")], ids=lambda p: p.name)
def test_every_make_target_shown_exists(doc: Path) -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    for line in commands(doc):
        try:
            words = shlex.split(line.split("#")[0])
        except ValueError:
            continue
        if words[:1] == ["make"]:
            for word in words[1:]:
                if "=" not in word:
                    assert word in targets, f"{doc.name}: `{line}`: no make target {word}"


# A sentence's left-over tail: a lone lowercase word and a full stop at the start of a line, right after a
# sentence ended (docs/runbooks.md had "... read access to pods.\n   listing. Without the key ...").
FRAGMENT = re.compile(r"\.\n[ >]*([a-z][\w-]*)\. ")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_sentence_fragment_is_left_between_sentences(doc: Path) -> None:
    text = FENCE.sub("", doc.read_text())
    assert [m.group(1) for m in FRAGMENT.finditer(text)] == []


def test_a_fragment_is_found() -> None:
    assert FRAGMENT.search("The key needs read access to pods.\n   listing. Without the key a pod")
    assert not FRAGMENT.search("The key needs read access to pods.\n   Without the key a pod")


def sentences(doc: Path) -> list[str]:
    text = " ".join(FENCE.sub("", doc.read_text()).split())
    return re.split(r"(?<=[.:;])\s+(?=[A-Z`(])", text)


def test_the_docs_do_not_deny_what_the_default_rollout_does() -> None:
    """With rollout.mode auto (the default), a merge restarts agent boxes by itself and a box that does not
    come up is rolled back: a doc may say the opposite only of `manual` boxes (docs/concepts.md said both
    outright, issue 26)."""
    from fleetllm.core.fleet.model import FleetSettings, RolloutMode

    assert FleetSettings().rollout.mode is RolloutMode.AUTO
    denials = re.compile(r"no automatic rollback|never restarts a box by itself|nothing restarts a box", re.I)
    for doc in DOCS:
        for sentence in sentences(doc):
            if denials.search(sentence):
                assert "manual" in sentence, f"{doc.name}: {sentence!r}"


def test_a_denial_is_found() -> None:
    probe = ROOT / "docs" / "concepts.md"
    assert any("manual" in s and "never restarts a box by itself" in s for s in sentences(probe))
    assert re.search(r"no automatic rollback", "There is no automatic rollback; the fix is a new commit", re.I)
