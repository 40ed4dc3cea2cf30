"""GitHub's published description of the commit-status operations, as kept here (README.md: from
@octokit/openapi, extracted by extract_github_statuses.py): self-contained, untouched by the extraction,
its own examples valid against its schemas, and every body the forge adapter sends valid against the
request schema (the adapter against the fake process, which validates both ways: tests/forge)."""

from __future__ import annotations

import json

import pytest

from fleetllm.core.forge import commit_status
from fleetllm.core.rollout.transitions import RolloutChange, Transition
from tests.contracts.extract_github_statuses import OPERATIONS, extract, refs
from tests.contracts.openapi import HERE, load, problems, request_schema, response_schema

DOCUMENT = load("github-statuses.openapi.json")
CREATE, LIST = (path for path, _ in OPERATIONS)


def test_the_kept_description_is_the_extraction_of_itself() -> None:
    """Every $ref resolves inside it, and extracting again changes nothing: the kept objects are the
    published ones, with nothing added."""
    again = extract(DOCUMENT, DOCUMENT["info"]["x-fleetllm-extracted-from"])
    assert again == DOCUMENT
    assert {(p, m) for p, methods in DOCUMENT["paths"].items() for m in methods} == set(OPERATIONS)
    for ref in refs(DOCUMENT):
        _, section, name = ref.removeprefix("#/").split("/")
        assert name in DOCUMENT["components"][section], ref
    assert DOCUMENT["info"]["x-fleetllm-extracted-from"].startswith("@octokit/openapi 23.0.2, ")
    assert (HERE / "github-statuses.openapi.json").read_text().endswith("\n")


def test_the_descriptions_own_examples_are_valid() -> None:
    create = DOCUMENT["paths"][CREATE]["post"]
    example = create["requestBody"]["content"]["application/json"]["examples"]["default"]["value"]
    assert problems(request_schema(DOCUMENT, CREATE, "post", "application/json"), example) == []
    status = DOCUMENT["components"]["examples"]["status"]["value"]
    assert problems(response_schema(DOCUMENT, CREATE, 201, "application/json", "post"), status) == []
    listed = DOCUMENT["components"]["examples"]["status-items"]["value"]
    assert problems(response_schema(DOCUMENT, LIST, 200, "application/json"), listed) == []
    assert problems(response_schema(DOCUMENT, CREATE, 201, "application/json", "post"), {"state": "x"}) != []


@pytest.mark.parametrize("transition", list(Transition))
@pytest.mark.parametrize("link", ["https://fleet.example.org", None])
def test_every_status_the_adapter_sends_is_a_valid_request(transition: Transition, link: str | None) -> None:
    change = RolloutChange("c" * 40, transition, 1.0, "box x: crash-loop " * 20, 3, "d" * 40, 0.5)
    body = commit_status(change, "fleetllm/rollout", link).body()
    assert problems(request_schema(DOCUMENT, CREATE, "post", "application/json"), body) == [], json.dumps(body)
    states = DOCUMENT["paths"][CREATE]["post"]["requestBody"]["content"]["application/json"]["schema"][
        "properties"]["state"]["enum"]
    assert body["state"] in states
