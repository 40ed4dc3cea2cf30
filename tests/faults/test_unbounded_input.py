"""Oversized client text against the real `fleetllm serve` (issue 16, finding 2): what a request may
store, what an answer may carry, and the memory it takes.

The attack of the issue: refused and unknown-box requests, each carrying 95 X-Forwarded-For headers
of 8 kB and an 8 kB X-LLMAO-Host. By default the header block is capped (server.max_header_bytes,
32 KiB) and such a request never reaches the app; with the cap raised to its maximum (1 MiB) it
does, and each fetch record and attention entry still stores at most MAX_RECORD_CHARS of text,
/admin/fetches pages at most 1,000 bounded records, and the server's memory stays bounded.
Before the fix, 100 such requests added about 80 MB to the state store.
"""

from __future__ import annotations

import http.client
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

from fleetllm.adapters.state.records import MAX_RECORD_CHARS
from tests.conftest import ROOT
from tests.support.plane import ControlPlane

from .conftest import FLEET_KEY, viewer

REQUESTS = 100
XFF_HEADERS, XFF_BYTES = 95, 8000
MAX_GROWTH_MIB = 96  # peak resident memory above the idle server's


def attack(port: int, i: int, key: str) -> int:
    """One request of the attack: (status) — a refused key, or a valid key for an unknown box."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest("GET", "/vllm/config")
        conn.putheader("Authorization", f"Bearer {key}")
        conn.putheader("X-LLMAO-Host", f"{i:04d}" + "h" * 8188)
        for _ in range(XFF_HEADERS):
            conn.putheader("X-Forwarded-For", "1" * XFF_BYTES)
        conn.endheaders()
        response = conn.getresponse()
        response.read()
        return response.status
    except (ConnectionError, http.client.HTTPException):
        return 0  # refused at the transport
    finally:
        conn.close()


def db_bytes(state: Path) -> int:
    with sqlite3.connect(state) as db:
        pages: int = db.execute("PRAGMA page_count").fetchone()[0] * db.execute("PRAGMA page_size").fetchone()[0]
    return pages


def test_oversized_headers_store_a_bounded_record(tmp_path: Path, start_plane: Callable[..., ControlPlane],
                                                  figures: Callable[..., None]) -> None:
    state = tmp_path / "plane" / "state.sqlite3"
    document = {"repo": {"path": str(ROOT / "fleet-repo-example"), "branch": "main", "refresh_interval_s": 3600},
                "secrets": {"fleet_key": "${env:FK}", "vllm_api_salt": "${env:SALT}",
                            "legacy_api_key": "${env:LEGACY}"},
                "state": {"url": f"sqlite:///{state}"}, "viewer_tokens": ["${env:VIEWER}"],
                "attention": {"max_entries": 1000}, "server": {"max_header_bytes": 1048576}}
    plane = start_plane(document)
    before_mem = plane.memory()
    plane.get("/admin/fetches?limit=1", viewer())  # flushes the log: the baseline size
    before_db = db_bytes(state)
    statuses = [attack(plane.port, i, FLEET_KEY if i % 2 else "wrong-key") for i in range(REQUESTS)]
    assert statuses == [404 if i % 2 else 403 for i in range(REQUESTS)]

    status, _, body = plane.get("/admin/fetches?limit=1000", viewer())
    assert status == 200
    listing = json.loads(body)
    records = [r for r in listing["fetches"] if r["endpoint"] == "config"]
    assert len(records) == REQUESTS
    for record in records:
        text = sum(len(v) for k, v in record.items() if isinstance(v, str) and k != "endpoint")
        assert text <= MAX_RECORD_CHARS
        kept, _, mark = record["forwarded_for"].partition("...[truncated: ")
        assert len(kept) == 512
        assert int(mark.removesuffix(" chars]")) >= XFF_HEADERS * XFF_BYTES
        assert "[truncated: 8192 chars]" in record["claimed_host"]
    assert len(body) < REQUESTS * 2 * MAX_RECORD_CHARS
    status, attention = plane.json("/admin/attention", viewer())
    assert status == 200
    assert len(attention["entries"]) == REQUESTS // 2
    assert len(json.dumps(attention)) < REQUESTS // 2 * 2 * MAX_RECORD_CHARS
    grown = db_bytes(state) - before_db
    assert grown < REQUESTS * 4 * MAX_RECORD_CHARS, grown  # before the fix: about 80 MB
    after_mem = plane.memory()
    assert after_mem.peak_mib - before_mem.rss_mib < MAX_GROWTH_MIB, (before_mem, after_mem)
    figures(case="100 requests with 95 x 8 kB X-Forwarded-For", store_growth_bytes=grown,
            bytes_per_request=grown // REQUESTS, fetches_answer_bytes=len(body),
            rss_before_mib=before_mem.rss_mib, peak_mib=after_mem.peak_mib)


def test_by_default_the_header_block_is_capped_at_the_transport(tmp_path: Path,
                                                                start_plane: Callable[..., ControlPlane]) -> None:
    from .conftest import plane_document

    plane = start_plane(plane_document(tmp_path, repo_path=ROOT / "fleet-repo-example"))
    assert attack(plane.port, 1, FLEET_KEY) in (0, 400, 431)  # closed, never answered by the app
    status, _, body = plane.get("/admin/fetches?limit=10", viewer())
    assert status == 200
    assert json.loads(body)["fetches"] == []


def test_fetch_listing_pages_and_refuses_bad_numbers(tmp_path: Path,
                                                     start_plane: Callable[..., ControlPlane]) -> None:
    from .conftest import box_headers, plane_document

    plane = start_plane(plane_document(tmp_path, repo_path=ROOT / "fleet-repo-example"))
    for _ in range(5):
        assert plane.get("/vllm/config", box_headers())[0] == 200
    status, page = plane.json("/admin/fetches?limit=2", viewer())
    assert status == 200
    assert len(page["fetches"]) == 2
    seen = [r["id"] for r in page["fetches"]]
    while page["next"]:
        status, page = plane.json(page["next"], viewer())
        assert status == 200
        seen += [r["id"] for r in page["fetches"]]
    assert len(seen) == 5
    assert seen == sorted(seen, reverse=True)
    for query in ("limit=%C2%B2", "limit=0", "limit=1001", "limit=-1", "limit=1e3", "limit=", "before=abc",
                  "before=%D9%A3", "limit=99999999999999999999999"):  # ² and Arabic-Indic 3: isdigit() accepts both
        status, answer = plane.json(f"/admin/fetches?{query}", viewer())
        assert status == 400, query
        assert "must be an integer" in answer["error"]
    status, answer = plane.json("/api/passes?limit=%C2%B2", viewer())
    assert status == 400
