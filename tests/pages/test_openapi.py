"""The JSON API against its OpenAPI description (schemas/openapi.yaml), with Schemathesis: requests
generated from the document (valid and invalid parameters) against the real app over the scenario's
state, with a viewer token, an admin token, a wrong token and none. No 500; every response conforms
to the document (status documented, body matches its schema, content type, auth enforced).

Schemathesis' pytest plugin (`@schema.parametrize`) does not run on pytest 9 yet, so each operation's
Hypothesis strategy is driven with `@given` directly, which is what the plugin does."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import ignored_auth

from tests.pages.conftest import World
from tests.server.conftest import ADMIN_TOKEN, VIEWER_TOKEN

OPERATIONS = ("/api/fleet", "/api/models", "/api/attention", "/api/revision", "/api/passes", "/admin/rollout")
WRITES = ("/admin/rollout/{action}",)  # documented; its answers are tested in tests/server/test_rollout_serving.py
CREDENTIALS = {"viewer": VIEWER_TOKEN, "admin": ADMIN_TOKEN, "wrong": "not-a-token-of-this-plane", "none": None}
EXPECTED = {"viewer": {200, 400}, "admin": {200, 400}, "wrong": {403}, "none": {401}}


def test_document_covers_the_api(world: World) -> None:
    schema = schemathesis.openapi.from_wsgi("/api/openapi.yaml", world.app)
    assert sorted(result.ok().path for result in schema.get_all_operations()) == sorted(OPERATIONS + WRITES)
    assert world.app.test_client().get("/api/openapi.yaml").headers["Content-Type"].startswith("application/yaml")


# Negative cases (parameters that break the document) for the operations that have parameters.
CASES = [*((path, GenerationMode.POSITIVE) for path in OPERATIONS),
         *((path, GenerationMode.NEGATIVE) for path in ("/api/fleet", "/api/passes"))]


@pytest.mark.parametrize(("path", "mode"), CASES)
def test_api_conforms_to_its_openapi_document(world: World, path: str, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_wsgi("/api/openapi.yaml", world.app)
    operation = schema[path]["GET"]
    seen: set[int] = set()

    @given(case=operation.as_strategy(generation_mode=mode))
    # derandomize: a fixed example set, so the coverage asserted below cannot depend on the draw
    @settings(max_examples=25, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    def check(case: schemathesis.Case) -> None:
        generated = dict(case.headers or {})  # may hold a generated (wrong) bearer: one more wrong token
        for who, token in CREDENTIALS.items():
            case.headers = {k: v for k, v in generated.items() if k.lower() != "authorization"}
            if token is not None:
                case.headers["Authorization"] = f"Bearer {token}"
            # ignored_auth takes the case's auth for a generated (invalid) one: not so with our real tokens
            response = case.call_and_validate(excluded_checks=[ignored_auth] if who in ("viewer", "admin") else [])
            assert response.status_code < 500
            assert response.status_code in EXPECTED[who], (who, response.status_code, response.text)
            seen.add(response.status_code)
        if "authorization" in {k.lower() for k in generated}:
            case.headers = generated
            assert case.call_and_validate().status_code in (401, 403)  # malformed or not a token of ours

    check()
    assert {200, 401, 403} <= seen if mode is GenerationMode.POSITIVE else 400 in seen
