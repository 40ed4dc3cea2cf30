"""Property: whatever llmao placement is drawn (IPv4 or ::ffff: keys, every row form, legacy pairs), the
import validates and every server's rendered bearer is the box contract's (or the shared legacy key)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetllm.adapters.git import read_directory
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.jsonvalue import freeze_mapping
from fleetllm.core.fleet.render import Bearers, render_box
from fleetllm.core.fleet.validate import validate_snapshot
from fleetllm.core.importer.emit import to_yaml
from fleetllm.core.importer.llmao import SECRET, import_llmao

from .test_import_llmao import contract_bearer

SALT, LEGACY_KEY = "short-salt", "sk-legacy-shared"
CATALOG = freeze_mapping({"models": [
    {"model_name": name, "litellm_params": {"model": f"hosted_vllm/{name}"},
     "model_info": {"self_hosted": True, "vllm": {"model": f"org/{name}", "max_model_len": 4096}}}
    for name in ("m-a", "m.b", "m_c")]})

octet = st.integers(1, 254)
host = st.builds(lambda a, b, c, d, mapped: ("::ffff:" if mapped else "") + f"{a}.{b}.{c}.{d}",
                 octet, octet, octet, octet, st.booleans())


@st.composite
def placements(draw: Any) -> tuple[dict[str, list[list[Any]]], set[tuple[str, int]]]:
    hosts = draw(st.lists(host, min_size=1, max_size=5, unique_by=lambda h: h.removeprefix("::ffff:")))
    placement: dict[str, list[list[Any]]] = {}
    legacy: set[tuple[str, int]] = set()
    for h in hosts:
        ports = draw(st.lists(st.sampled_from([8001, 8002, 8003, 8000, 7999]), min_size=1, max_size=3, unique=True))
        rows = []
        for i, port in enumerate(ports):
            model = draw(st.sampled_from(["m-a", "m.b", "m_c"]))
            form = draw(st.sampled_from(["2", "3", "4"]))
            row: list[Any] = [model, port]
            if form != "2":
                row.append(f"p{i}" if form == "3" or draw(st.booleans()) else None)
            if form == "4":
                row.append(draw(st.integers(10000, 60000)))
            if (row[2] if len(row) > 2 and row[2] else model) in {r[2] if len(r) > 2 and r[2] else r[0] for r in rows}:
                row = [model, port, f"p{i}", *row[3:]]  # llmao refuses two processes of one name on a box
            rows.append(row)
            if port < 8001:
                legacy.add((h.removeprefix("::ffff:"), port))
        placement[h] = rows
    return placement, legacy


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(placements())
def test_any_placement_imports_valid_with_the_contracts_bearers(drawn: tuple[dict[str, list[list[Any]]],
                                                                              set[tuple[str, int]]]) -> None:
    placement, legacy = drawn
    config = freeze_mapping({"fleet": {"key": SECRET, "vllm_api_salt": SECRET, "selfhost_api_key": SECRET,
                                       "hosts": placement}})
    imported = import_llmao(config, CATALOG, frozenset(legacy))
    with tempfile.TemporaryDirectory() as tmp:
        for name, doc in (("fleet.yaml", imported.fleet), ("models.yaml", imported.models),
                          ("placement.yaml", imported.placement)):
            (Path(tmp) / name).write_text(to_yaml(doc))
        validation = validate_snapshot(read_directory(tmp))
    assert validation.fleet is not None, [d.text() for d in validation.errors]
    bearers = Bearers(Salt(SALT), LEGACY_KEY)
    for h, rows in placement.items():
        box = h.removeprefix("::ffff:")
        served = {s["port"]: s["api_key"] for s in render_box(validation.fleet, box, bearers)["servers"]}  # type: ignore[union-attr,index]
        for row in rows:
            expected = LEGACY_KEY if (box, row[1]) in legacy else contract_bearer(SALT, h, row[1])
            assert served[row[1]] == expected
