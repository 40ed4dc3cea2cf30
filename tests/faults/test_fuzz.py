"""Bad input, fuzzed with hypothesis: never a crash or a 500, always a clear error.

- the strict YAML loader over arbitrary bytes and over mutated YAML;
- schema + semantic validation over generated fleet files (random shapes in the right places), and
  for every fleet that validates: rendering (the recipe `settings` into vLLM flags), the installer's
  parse of the rendered box JSON, and the Supervisor program it writes;
- secret-reference expansion (no secret value in any error);
- the box JSON the installer parses, arbitrary and mutated;
- request headers and bodies of GET /vllm/config and POST /vllm/report (the real Flask app);
- the gateway's request parsing: its pure rules, and raw HTTP requests to the real gateway handler.

Bounded for CI (a few hundred examples each). bench/fuzz_atheris.py runs coverage-guided (atheris)
over the loader, validation, the box JSON and secret references for as long as one likes.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from flask.testing import FlaskClient
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from fleetllm.core.fleet import strictyaml
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.files import FLEET_FILES, Snapshot
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.fleet.render import Bearers, render_all
from fleetllm.core.fleet.validate import validate_snapshot
from fleetllm.server.app import create_app
from fleetllm.server.runtime import Runtime, start_up
from fleetllm.settings import load_config
from fleetllm_contract import secretref
from fleetllm_gateway import errors as gateway_errors
from fleetllm_gateway import forwarding
from fleetllm_installer.boxjson import BoxJsonError, parse_text
from fleetllm_installer.fit import check_fit
from fleetllm_installer.main import assumed_gpus, render_units
from fleetllm_installer.report import fit_json
from fleetllm_installer.settings import load as load_settings
from fleetllm_installer.units import UnitError
from tests.conftest import EXAMPLE, ROOT
from tests.support.gateway_thread import ThreadedHttpServer
from tests.support.write_killer import ThreadedServer

from .conftest import FLEET_KEY, KNOWN_BOX, LEGACY_KEY, PLANE_ENV, SALT, plane_document

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
T = TypeVar("T")
DIAGNOSTIC = re.compile(r"^[^:]+:\d+:\d+: ")
YAML_NOISE = [*"&*!|>-:?{}[],#%@`'\"\t\n ~", "<<", "---", "...", "!!str ", "*a", "&a ", "\\u0000", "\ufeff"]



def outcome(call: Callable[..., T], *args: Any, errors: type[Exception] | tuple[type[Exception], ...]
            ) -> tuple[T | None, Exception | None]:
    """(result, None), or (None, the exception) when `call` raised one of `errors`: anything else fails."""
    try:
        return call(*args), None
    except errors as exc:
        return None, exc


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False),
                         st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)), max_leaves=12)


@st.composite
def mutated(draw: st.DrawFn, text: str) -> str:
    """`text` with a few characters inserted, deleted or replaced by YAML-significant ones."""
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        noise = draw(st.sampled_from(YAML_NOISE))
        if op == "insert":
            text = text[:at] + noise + text[at:]
        elif op == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 8)):]
        else:
            text = text[:at] + noise + text[at + len(noise):]
    return text


EXAMPLE_FILES = {name: (EXAMPLE / name).read_text() for name in FLEET_FILES}


# --- the YAML loader -------------------------------------------------------------------------------

def check_document(doc: strictyaml.Document) -> None:
    for problem in doc.problems:
        assert problem.rule.startswith("yaml-") and problem.message, problem
        assert problem.mark.line >= 1 and problem.mark.column >= 1, problem
    if doc.root is not None:
        json.dumps(doc.value)  # plain JSON data, whatever came in


@FUZZ
@given(st.binary(max_size=400))
def test_the_loader_takes_any_bytes(data: bytes) -> None:
    check_document(strictyaml.load(data, "f.yaml"))


@FUZZ
@given(st.sampled_from(list(EXAMPLE_FILES.values())).flatmap(mutated))
@example("a: &a [*a]\n")
@example("a: !!binary AAAA\n")
def test_the_loader_takes_mutated_fleet_files(text: str) -> None:
    check_document(strictyaml.load(text, "f.yaml"))


# --- validation, rendering, the installer's parse of what was rendered ------------------------------

ports = st.one_of(st.integers(8001, 8003), st.integers(-5, 70000), st.text(max_size=6), json_values)
rows = st.lists(st.one_of(st.tuples(st.sampled_from(["qwen3-8b", "nope", ""]), ports),
                          st.tuples(st.sampled_from(["qwen3-8b", "gemma3-27b"]), ports, st.text(max_size=8)),
                          json_values), max_size=3)
settings_maps = st.dictionaries(st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True) | st.text(max_size=10),
                                json_values, max_size=4)


@st.composite
def fleets(draw: st.DrawFn) -> dict[str, str]:
    """The example's files, one of them replaced by a generated document of roughly the right shape."""
    files = dict(EXAMPLE_FILES)
    target = draw(st.sampled_from(["placement", "models", "fleet", "mutated"]))
    if target == "placement":
        hosts = draw(st.dictionaries(st.sampled_from(["203.0.113.10", "203.0.113.24", "box-a", "", "::1"])
                                     | st.text(max_size=10), rows | json_values, max_size=3))
        files["placement.yaml"] = yaml.safe_dump({"hosts": hosts}, allow_unicode=True)
    elif target == "models":
        models = yaml.safe_load(EXAMPLE_FILES["models.yaml"])
        name = draw(st.sampled_from(sorted(models["models"])))
        vllm = models["models"][name]["vllm"]
        vllm["settings"] = draw(settings_maps)
        if draw(st.booleans()):
            vllm[draw(st.sampled_from(["max_model_len", "vram_gb", "args", "gpu_memory_utilization", "model"]))] \
                = draw(json_values)
        files["models.yaml"] = yaml.safe_dump(models, allow_unicode=True)
    elif target == "fleet":
        fleet = yaml.safe_load(EXAMPLE_FILES["fleet.yaml"]) or {}
        fleet[draw(st.sampled_from(["listen_ports", "reconcile", "legacy_servers", "max_servers_per_box",
                                    "version"]))] = draw(json_values)
        files["fleet.yaml"] = yaml.safe_dump(fleet, allow_unicode=True)
    else:
        name = draw(st.sampled_from(FLEET_FILES))
        files[name] = draw(mutated(files[name]))
    return files


@FUZZ
@given(fleets())
def test_validation_either_accepts_and_renders_or_says_where(files: dict[str, str]) -> None:
    snapshot = Snapshot("f" * 40, {k: v.encode() for k, v in files.items()}, {k: k for k in FLEET_FILES})
    result = validate_snapshot(snapshot)
    if result.fleet is None:
        assert result.errors
        for diagnostic in result.diagnostics:
            assert DIAGNOSTIC.match(diagnostic.text()), diagnostic.text()
        return
    the_installer_takes_every_box_of(result.fleet)


BOX_SETTINGS = load_settings({"FLEETLLM_DATA_DIR": "/srv/data", "FLEETLLM_SUPERVISOR_CONF_DIR": "/srv/conf"},
                             need_control_plane=False)


def the_installer_takes_every_box_of(fleet: Fleet) -> None:
    """Every box JSON rendered from a valid fleet passes the installer's own checks, as the installer gets
    it (JSON text): the box JSON, the fit check and card division, and the Supervisor program of every
    server (issue 16, finding 5: what validates must never be refused on the box)."""
    for host, document in render_all(fleet, Bearers(Salt(SALT), LEGACY_KEY)).items():
        box = parse_text(json.dumps(document), host)
        fit = check_fit(box.servers, assumed_gpus("2x80"), 1000.0)
        render_units(box, fit, BOX_SETTINGS)


# Strings a careless or hostile pull request might write: valid-looking, with something after the end.
TAILS = ["", "\n", "\r\n", "\r", "\x00", "\x01", "\x1b", "\x7f", "\x85", "\u2028", " ", "\t", "\u00e9", "\u00b2"]
nasty_text = st.tuples(st.sampled_from(["org/m", "/models/m", "m", "x.y", "--dtype", "half", "1", "a b", ""]),
                       st.just("") | st.sampled_from(TAILS), st.just("") | st.sampled_from(TAILS[:4])).map("".join)
nasty_numbers = st.sampled_from([0, 1, 4096, 10**30, 2**63, 1e308, 1e-300, -1, 0.5, 1.0000001, 16_777_216,
                                 16_777_217, 1_000_000, 1_000_001, 1 << 30, (1 << 30) + 1])
RECIPE_FIELDS = ["model", "served_model_name", "args", "settings", "max_model_len", "vram_gb", "disk_gb",
                 "kv_bytes_per_token", "gpu_memory_utilization"]


@st.composite
def nasty_fleets(draw: st.DrawFn) -> dict[str, str]:
    """The example fleet with a recipe's fields, a model name or a row's name replaced by nasty values.
    Written as JSON, which is YAML: escapes carry every character through the strict loader."""
    models = yaml.safe_load(EXAMPLE_FILES["models.yaml"])
    placement = yaml.safe_load(EXAMPLE_FILES["placement.yaml"])
    name = draw(st.sampled_from(sorted(models["models"])))
    vllm = models["models"][name]["vllm"]
    for field in draw(st.lists(st.sampled_from(RECIPE_FIELDS), min_size=1, max_size=2, unique=True)):
        if field == "settings":
            vllm[field] = draw(st.dictionaries(nasty_text, nasty_text | nasty_numbers | st.booleans(), max_size=3))
        elif field == "args":
            vllm[field] = draw(st.one_of(nasty_text, st.lists(nasty_text, max_size=4)))
        elif field in ("model", "served_model_name"):
            vllm[field] = draw(nasty_text)
        else:
            vllm[field] = draw(nasty_numbers)
    if draw(st.integers(0, 3)) == 0:  # a row's third element: the process name
        rows = next(iter(placement["hosts"].values()))
        rows = rows["servers"] if isinstance(rows, dict) else rows
        rows[0] = [*rows[0][:2], draw(nasty_text)]
    return {**EXAMPLE_FILES, "models.yaml": json.dumps(models), "placement.yaml": json.dumps(placement)}


@FUZZ
@given(nasty_fleets())
@example({**EXAMPLE_FILES, "models.yaml": EXAMPLE_FILES["models.yaml"].replace(
    "model: Qwen/Qwen3-8B-FP8", 'model: "Qwen/Qwen3-8B-FP8\\n"')})
def test_a_valid_fleet_never_renders_a_box_json_the_installer_refuses(files: dict[str, str]) -> None:
    result = validate_snapshot(Snapshot("n" * 40, {k: v.encode() for k, v in files.items()},
                                        {k: k for k in FLEET_FILES}))
    event("valid" if result.fleet is not None else "invalid")
    if result.fleet is not None:
        the_installer_takes_every_box_of(result.fleet)


# --- secret references -----------------------------------------------------------------------------

SECRETS = {"A": "s3cr3t-value-A", "B_KEY": "another-secret-B", "EMPTY": ""}
reference_texts = st.lists(st.one_of(
    st.sampled_from(["${env:A}", "${env:B_KEY}", "${env:NOPE}", "${env:EMPTY}", "${cred:x}", "${file:/nonexistent}",
                     "${file:relative}", "${env:}", "${env:A", "$${env:A}", "$$", "$", "${", "}", "${vault:x}",
                     "${env:A}${env:B_KEY}"]),
    st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=8)), max_size=6).map("".join)


@FUZZ
@given(reference_texts)
@example("${file:/run/a\x00b}")  # found by atheris: a NUL byte reached open() as a ValueError
@example("${cred:a\x00b}")
def test_secret_references_expand_or_fail_without_the_secret(text: str) -> None:
    assume(not any(v and v in text for v in SECRETS.values()))
    value, error = outcome(secretref.expand, text, SECRETS, errors=secretref.SecretRefError)
    if error is not None:
        assert str(error)
        assert not any(v and v in str(error) for v in SECRETS.values()), str(error)
    else:
        assert isinstance(value, str)


# --- the box JSON the installer parses -------------------------------------------------------------

@pytest.fixture(scope="module")
def rendered_box() -> dict[str, Any]:
    snapshot = Snapshot("r" * 40, {k: v.encode() for k, v in EXAMPLE_FILES.items()}, {k: k for k in FLEET_FILES})
    fleet = validate_snapshot(snapshot).fleet
    assert fleet is not None
    return render_all(fleet, Bearers(Salt(SALT), LEGACY_KEY))[KNOWN_BOX]


@st.composite
def box_mutations(draw: st.DrawFn, document: dict[str, Any]) -> Any:
    doc = json.loads(json.dumps(document))
    for _ in range(draw(st.integers(1, 3))):
        servers = doc.get("servers")
        server = draw(st.sampled_from(servers)) if isinstance(servers, list) and servers else doc
        target = draw(st.sampled_from([doc, server]))
        if not isinstance(target, dict) or not target:
            continue
        key = draw(st.sampled_from(sorted(target)))
        if draw(st.booleans()):
            del target[key]
        else:
            target[key] = draw(json_values)
    return doc


@FUZZ
@given(data=st.data())
def test_the_installer_parses_any_box_json_or_names_the_problem(rendered_box: dict[str, Any],
                                                                data: st.DataObject) -> None:
    text = data.draw(st.one_of(
        st.text(max_size=200),
        box_mutations(rendered_box).map(json.dumps),
        st.just(json.dumps(rendered_box)).flatmap(lambda t: st.integers(0, len(t)).map(lambda n: t[:n])),
    ))
    box, error = outcome(parse_text, text, KNOWN_BOX, errors=BoxJsonError)
    if isinstance(error, BoxJsonError):
        assert error.problems and all(isinstance(p, str) and p for p in error.problems)
        bearers = [s.get("api_key") for s in rendered_box["servers"]]
        assert not any(b and b in "; ".join(error.problems) for b in bearers)
    else:
        assert box is not None and box.host == KNOWN_BOX


hostile_numbers = st.one_of(st.floats(), st.integers(), st.sampled_from([10**400, 1e308, -1e308, 2**64]))
hostile_values = st.one_of(json_values, hostile_numbers, nasty_numbers, nasty_text, st.lists(nasty_text, max_size=3))


@st.composite
def hostile_boxes(draw: st.DrawFn, document: dict[str, Any]) -> str:
    """The rendered box JSON with a few fields of its servers set to hostile values, as JSON text (NaN and
    Infinity included, as Python's json writes them), sometimes nested deep or with long integers."""
    doc = json.loads(json.dumps(document))
    for _ in range(draw(st.integers(1, 3))):
        server = draw(st.sampled_from(doc["servers"]))
        field = draw(st.sampled_from([*RECIPE_FIELDS, "api_key", "name", "port", "digest", "listen_host"]))
        server[field] = draw(hostile_values)
    text = json.dumps(doc)
    wrap = draw(st.sampled_from(["", "deep", "long-int"]))
    if wrap == "deep":
        depth = draw(st.sampled_from([63, 65, 5000]))
        text = text.replace('"servers": [', '"x": ' + "[" * depth + "]" * depth + ', "servers": [', 1)
    elif wrap == "long-int":
        text = text.replace('"port": ', '"port": ' + "1" * draw(st.sampled_from([4300, 4301, 100_000])), 1)
    return text


@FUZZ
@given(data=st.data())
@example(data=None)
def test_the_installer_refuses_or_installs_any_box_json(rendered_box: dict[str, Any], data: st.DataObject | None
                                                        ) -> None:
    """From the box JSON text to the Supervisor programs, as Installer.run goes: a BoxJsonError or UnitError
    (refused, reported) or programs; never another exception (issue 16, finding 10: OverflowError)."""
    text = data.draw(hostile_boxes(rendered_box)) if data is not None else json.dumps(
        {**rendered_box, "servers": [{**rendered_box["servers"][0], "vram_gb": 1e308, "max_model_len": 10**400}]})
    box, error = outcome(parse_text, text, KNOWN_BOX, errors=BoxJsonError)
    if box is None:
        assert isinstance(error, BoxJsonError) and error.problems
        assert not any(s["api_key"] in "; ".join(error.problems) for s in rendered_box["servers"])
        return
    for gpus in (assumed_gpus("1x80"), assumed_gpus("4x24"), None):
        fit = check_fit(box.servers, gpus, 500.0)
        json.dumps(fit_json(fit), allow_nan=False)  # the report's fit part is plain JSON
        units, unit_error = outcome(render_units, box, fit, BOX_SETTINGS, errors=UnitError)
        assert units is not None or str(unit_error)


# --- GET /vllm/config and POST /vllm/report --------------------------------------------------------

@pytest.fixture(scope="module")
def plane_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlaskClient]:
    from tests.conftest import git

    root = tmp_path_factory.mktemp("fuzz-plane")
    repo = root / "fleet"
    repo.mkdir()
    for name, text in EXAMPLE_FILES.items():
        (repo / name).write_text(text)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "fleet")
    config_path = root / "cp.yaml"
    config_path.write_text(yaml.safe_dump(plane_document(root / "state", repo_path=repo,
                                                         attention={"max_entries": 20})))
    runtime: Runtime = start_up(load_config(config_path, env=PLANE_ENV))
    try:
        yield create_app(runtime).test_client()
    finally:
        runtime.stop()


header_text = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=255, blacklist_characters="\x7f"),
                      max_size=60)
right_key = st.sampled_from([f"Bearer {FLEET_KEY}", f"bearer {FLEET_KEY}", f"Bearer  {FLEET_KEY} "])
authorizations = st.one_of(right_key, right_key, right_key, st.none(), header_text, st.sampled_from([
    f"Bearer {FLEET_KEY}", f"bearer {FLEET_KEY}", f"Bearer  {FLEET_KEY} ", "Bearer", "Bearer ", "Basic Zm9vOmJhcg==",
    f"Bearer {FLEET_KEY}\x00", f"Bearer {FLEET_KEY[:-1]}", "Bearer " + "x" * 5000]))
hosts = st.one_of(st.just(KNOWN_BOX), st.just(KNOWN_BOX), st.none(), header_text, st.sampled_from([KNOWN_BOX, "198.51.100.23", "::ffff:203.0.113.24",
                                                           "[2001:db8::1]", "", " ", "203.0.113.24 ", "x" * 3000]))
forwarded = st.one_of(st.none(), header_text, st.lists(st.ip_addresses().map(str), max_size=4).map(", ".join))
report_bodies = st.one_of(st.binary(max_size=300), json_values.map(lambda v: json.dumps(v).encode()),
                          st.just(b'{"revision": NaN}'), st.just(b"{" * 2000), st.just(b"[" * 100_000))
ALLOWED = {200, 304, 400, 403, 404, 413}


def check_answer(status: int, body: bytes, content_type: str | None) -> None:
    event(f"HTTP {status}")
    assert status in ALLOWED, (status, body[:300])
    if status >= 400:
        assert content_type == "application/json"
        assert json.loads(body)["error"]
        for secret in (FLEET_KEY, SALT, LEGACY_KEY):
            assert secret.encode() not in body


@FEW
@given(authorizations, hosts, forwarded, st.one_of(st.none(), header_text))
def test_config_requests_with_any_headers(plane_client: FlaskClient, authorization: str | None, host: str | None,
                                          xff: str | None, if_none_match: str | None) -> None:
    headers = {k: v for k, v in (("Authorization", authorization), ("X-LLMAO-Host", host), ("X-Forwarded-For", xff),
                                 ("If-None-Match", if_none_match)) if v is not None}
    response = plane_client.get("/vllm/config", headers=headers)
    check_answer(response.status_code, response.data, response.mimetype if response.status_code >= 400 else None)


@FEW
@given(authorizations, hosts, report_bodies, st.one_of(st.none(), header_text))
def test_report_requests_with_any_headers_and_body(plane_client: FlaskClient, authorization: str | None,
                                                   host: str | None, body: bytes, content_type: str | None) -> None:
    headers = {k: v for k, v in (("Authorization", authorization), ("X-LLMAO-Host", host),
                                 ("Content-Type", content_type)) if v is not None}
    response = plane_client.post("/vllm/report", headers=headers, data=body)
    check_answer(response.status_code, response.data, response.mimetype if response.status_code >= 400 else None)


@st.composite
def hostile_reports(draw: st.DrawFn) -> bytes:
    """Valid reports with one hostile part (issue 16, finding 8): deep nesting, a long or huge number,
    or padding past 64 KiB."""
    report = {"revision": "r", "installer_version": "0.1.0", "outcome": "installed"}
    text = json.dumps(report).encode()[:-1]
    kind = draw(st.sampled_from(["deep", "number", "float", "large"]))
    if kind == "deep":
        depth = draw(st.integers(1, 30_000))
        opener = draw(st.sampled_from([b"[", b'{"a":']))
        closer = b"]" if opener == b"[" else b"}"
        return text + b', "fit": ' + opener * depth + b"1" + closer * depth + b"}"
    if kind == "number":
        return text + b', "fit": {"ok": true, "vram_needed_gb": ' + b"7" * draw(st.integers(1, 6000)) + b"}}"
    if kind == "float":
        return text + b', "fit": {"ok": true, "vram_needed_gb": 1e' + str(draw(st.integers(0, 9999))).encode() + b"}}"
    return text + b', "message": "' + b"x" * draw(st.integers(60_000, 70_000)) + b'"}'


@FEW
@given(hostile_reports())
def test_hostile_reports_get_a_4xx_and_are_recorded(plane_client: FlaskClient, body: bytes) -> None:
    headers = {"Authorization": f"Bearer {FLEET_KEY}", "X-LLMAO-Host": KNOWN_BOX,
               "X-Fleetllm-Report-Key": Salt(SALT).report_key(KNOWN_BOX)}
    response = plane_client.post("/vllm/report", headers=headers, data=body)
    event(f"HTTP {response.status_code}")
    assert response.status_code in (200, 400, 413), (response.status_code, response.data[:300])
    check_answer(response.status_code, response.data, response.mimetype if response.status_code >= 400 else None)
    metrics = plane_client.get("/metrics").get_data(as_text=True)
    assert 'endpoint="report",status="500"' not in metrics


# --- the gateway -----------------------------------------------------------------------------------

@FUZZ
@given(st.one_of(st.none(), header_text, st.text(max_size=40)))
def test_gateway_bearer_check_takes_any_header(value: str | None) -> None:
    assert forwarding.bearer_ok(value, (b"tok",)) is (value is not None and value.strip(" \t").lower().startswith(
        "bearer ") and value.strip(" \t").partition(" ")[2] == "tok")


@FUZZ
@given(st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode()),
                 st.just(b"[" * 50_000), st.just(b'{"model": NaN}')))
def test_gateway_model_selection_takes_any_body(body: bytes) -> None:
    name, error = outcome(forwarding.select_model, body, errors=gateway_errors.BodyError)
    if isinstance(error, gateway_errors.BodyError):
        assert error.error.status == 400
    else:
        assert isinstance(name, str)


@FUZZ
@given(st.text(max_size=60).map(lambda t: "/" + t), st.text(max_size=20))
def test_gateway_route_parsing_takes_any_path(path: str, query: str) -> None:
    route = forwarding.parse_route(path, query)
    assert route is None or isinstance(route, forwarding.PathRoute | forwarding.Redirect)
    name = forwarding.models_api_name(path)
    assert name is None or isinstance(name, str)


@pytest.fixture(scope="module")
def gateway_port() -> Iterator[int]:
    """The real gateway handler behind the gateway's own HTTP server (fleetllm_gateway.httpserver, as
    fleetllm_gateway.serve runs it) in front of an upstream that answers 200 to anything."""
    from aiohttp import web

    from fleetllm_gateway.app import Gateway
    from fleetllm_gateway.config import parse_config

    async def ok(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"ok": True})

    upstream = web.Application()
    upstream.router.add_route("*", "/{tail:.*}", ok)
    with ThreadedServer(upstream) as up:
        config = parse_config(json.dumps({"authTokens": ["tok"], "maxBodyBytes": 4096, "models": {
            "m": {"url": f"http://127.0.0.1:{up.port}"}, "n/x": {"url": f"http://127.0.0.1:{up.port}/base"}}}))
        gateway = Gateway(config)
        with ThreadedHttpServer(lambda: gateway.handle, on_stop=gateway.close) as front:
            yield front.port


methods = st.sampled_from(["GET", "POST", "POST", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH", "G\x01T", "get"])
paths = st.one_of(st.sampled_from(["/health", "/v1/models", "/v1/models/m", "/v1/models/%ZZ", "/metrics",
                                   "/route/m/v1/x", "/route/m", "/route/", "/route/%2F/x", "/route/n%2Fx/y",
                                   "/v1/chat/completions", "http://evil/route/m/x", "*", "//", "/%00"]),
                  st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=40).map(
                      lambda t: "/" + t))
gateway_headers = st.lists(st.tuples(st.sampled_from(["Authorization", "Content-Length", "Transfer-Encoding",
                                                      "Expect", "Connection", "Host", "X-Forwarded-For", "Te",
                                                      "Content-Type", "X-Odd"]),
                                     st.one_of(st.sampled_from(["Bearer tok", "bearer tok", "Bearer nope", "chunked",
                                                                "100-continue", "close", "0", "5", "99999999",
                                                                "-1", "trailers", "keep-alive, X-Odd"]),
                                               st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126),
                                                       max_size=30))), max_size=3)
gateway_bodies = st.one_of(st.just(b""), st.binary(max_size=200), st.just(b'{"model": "m"}'),
                           st.just(b'{"model": "nope"}'), json_values.map(lambda v: json.dumps(v).encode()))


def raw_exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


@FEW
@given(methods, paths, st.booleans(), st.booleans(), gateway_headers, gateway_bodies)
def test_the_gateway_answers_any_request_without_a_500(gateway_port: int, method: str, path: str, bearer: bool,
                                                       framed: bool, headers: list[tuple[str, str]],
                                                       body: bytes) -> None:
    """Mostly well-framed requests with the bearer (so that routing, not only the HTTP parser, is
    exercised), plus whatever headers were drawn, framing ones included."""
    base = [("Authorization", "Bearer tok")] if bearer else []
    if framed:
        base.append(("Content-Length", str(len(body))))
    lines = "".join(f"{k}: {v}\r\n" for k, v in [*base, *headers])
    head = f"{method} {path} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n{lines}\r\n"
    answer = raw_exchange(gateway_port, head.encode("latin-1") + body)
    if not answer:
        return  # the connection closed without an answer (the client's end came first): no crash either
    status_line = answer.split(b"\r\n", 1)[0]
    assert re.match(rb"^HTTP/1\.[01] \d{3}", status_line), answer[:200]
    status = int(status_line.split()[1])
    event(f"HTTP {status} " + answer.split(b"\r\n\r\n", 1)[-1][:50].decode(errors="replace"))
    assert status != 500, answer[:500]


# --- coverage-guided, briefly (longer runs: bench/fuzz_atheris.py, figures in docs/reliability.md) -----

@pytest.mark.integration  # atheris is a dev dependency: CI must run this, not skip it
def test_atheris_finds_no_crash_in_a_short_run(tmp_path: Path) -> None:
    pytest.importorskip("atheris")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "fuzz_atheris.py"), "all", "-max_total_time=5",
                           "-runs=200000", f"-artifact_prefix={tmp_path}/"], capture_output=True, text=True,
                          timeout=120, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"Done \d+ runs", done.stderr), done.stderr[-2000:]
    assert not list(tmp_path.glob("crash-*"))
