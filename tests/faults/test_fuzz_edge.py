"""Fuzzing the control plane's edge added for issue 16 (findings 2 and 11): query integers, stored
client text, and the HTTP layer's bookkeeping. Hypothesis, bounded for CI, on the real Flask app
(the same runtime the server builds) and on the pure parts.

Properties: every query value of `limit`/`before` gets 200 or a 400 naming the parameter, never a 500;
whatever text a client sends, what the store keeps of it fits its cap and says when it was cut; the
connection caps never go negative or over their limits, whatever the order of admits and releases.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import quote

import pytest
import yaml
from flask.testing import FlaskClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fleetllm.adapters.state.records import MAX_MARK, STORED_CHARS, BoxApi, FetchRecord, clip
from fleetllm.server.app import create_app
from fleetllm.server.guard import ConnectionCaps
from fleetllm.server.params import ParamError, int_param
from fleetllm.server.runtime import Runtime, start_up
from fleetllm.settings import load_config
from tests.conftest import ROOT

from .conftest import PLANE_ENV, VIEWER_TOKEN, plane_document

FEW = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])
query_text = st.one_of(st.text(max_size=30), st.integers(-10**30, 10**30).map(str),
                       st.sampled_from(["²", "٣", "1e3", "0x10", " 5", "5 ", "+5", "1_000", "", "１０"]))


@pytest.fixture(scope="module")
def viewer_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlaskClient]:
    root = tmp_path_factory.mktemp("fuzz-edge")
    config_path = root / "cp.yaml"
    config_path.write_text(yaml.safe_dump(plane_document(root / "state", repo_path=ROOT / "fleet-repo-example")))
    runtime: Runtime = start_up(load_config(config_path, env=PLANE_ENV))
    try:
        yield create_app(runtime).test_client()
    finally:
        runtime.stop()


@FEW
@given(st.sampled_from(["/admin/fetches?limit=", "/admin/fetches?before=", "/api/passes?limit="]), query_text)
def test_query_integers_get_an_answer_or_a_400_naming_them(viewer_client: FlaskClient, path: str, value: str) -> None:
    response = viewer_client.get(path + quote(value), headers={"Authorization": f"Bearer {VIEWER_TOKEN}"})
    event(f"HTTP {response.status_code}")
    assert response.status_code in (200, 400), (value, response.data[:200])
    if response.status_code == 400:
        name = path.rsplit("?", 1)[1].rstrip("=")
        assert json.loads(response.data)["error"].startswith(f"{name} must be an integer")


@FEW
@given(query_text, st.integers(0, 5), st.integers(5, 10**6))
def test_int_param_reads_ascii_digits_in_range_only(value: str, lo: int, hi: int) -> None:
    text = value.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 18 and lo <= int(text) <= hi):
        with pytest.raises(ParamError, match=rf"^n must be an integer in {lo}\.\.{hi}$"):
            int_param({"n": value}, "n", None, lo, hi)
        return
    got = int_param({"n": value}, "n", None, lo, hi)
    assert got == int(text)


@FEW
@given(st.text(max_size=3000), st.text(max_size=3000), st.text(max_size=100))
def test_stored_client_text_fits_its_cap(host: str, xff: str, peer: str) -> None:
    record = FetchRecord(at=1.0, endpoint=BoxApi.CONFIG, status=403, peer=peer, claimed_host=host,
                         forwarded_for=xff, box=host).bounded()
    for name, value in (("claimed_host", record.claimed_host), ("forwarded_for", record.forwarded_for),
                        ("box", record.box), ("peer", record.peer)):
        assert value is not None
        assert len(value) <= STORED_CHARS[name] + MAX_MARK
        original = {"claimed_host": host, "forwarded_for": xff, "box": host, "peer": peer}[name]
        assert value == original or value == clip(original, STORED_CHARS[name])
        assert (value != original) == (len(original) > STORED_CHARS[name])


@FEW
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(["10.0.0.1", "10.0.0.2", "2001:db8::1", "2001:db8::2",
                                                          "::ffff:10.0.0.1", "bogus"])), max_size=200))
def test_connection_caps_hold_under_any_order(steps: list[tuple[bool, str]]) -> None:
    caps = ConnectionCaps(max_total=6, max_per_peer=2, max_per_prefix=8)
    held: list[str] = []
    for admit, peer in steps:
        if admit:
            if caps.admit(peer) is None:
                held.append(peer)
        elif peer in held:
            held.remove(peer)
            caps.release(peer)
        assert 0 <= caps.total == len(held) <= 6
        assert all(caps.held_by(p) <= 2 for p in held)
