"""Boot storm against the real `fleetllm serve`: 1,000 boxes start within a second (installer download,
then config fetch, each on its own connection), with 100 wrong keys and 100 made-up host names mixed
in (bench/boot_storm.py drives it; `make bench-boot-storm` prints the same figures).

Every valid box gets its own JSON, every wrong key a 403, every made-up name a 404; the attention list
stays at its cap; every request is in the fetch log; the server's memory grows by a bounded amount.
How fast the crowd started and was answered is a figure, not an assertion: it moves with the machine's
load (bench/boot_storm.py measures it; docs/reliability.md and docs/benchmarks.md quote it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from bench.boot_storm import FLEET_KEY, SALT, clients, make_repo, raise_open_files, run_storm
from bench.fleetgen import box_name
from fleetllm.adapters.state import open_store
from tests.support.plane import ControlPlane

from .conftest import VIEWER_TOKEN

BOXES, WRONG_KEYS, MADE_UP, CAP = 1000, 100, 100, 50
MAX_GROWTH_MIB = 64  # peak resident memory above the idle server's


def test_a_thousand_booting_boxes_are_all_answered(tmp_path: Path, start_plane: Callable[..., ControlPlane],
                                          figures: Callable[..., None]) -> None:
    raise_open_files(4 * (BOXES + WRONG_KEYS + MADE_UP) + 256)
    repo = make_repo(tmp_path, BOXES)
    state = tmp_path / "state.sqlite3"
    plane = start_plane({"repo": {"path": str(repo), "branch": "main", "refresh_interval_s": 3600},
                         "secrets": {"fleet_key": "${env:STORM_FK}", "vllm_api_salt": "${env:STORM_SALT}"},
                         "state": {"url": f"sqlite:///{state}"}, "viewer_tokens": ["${env:VIEWER}"],
                         "attention": {"max_entries": CAP}}, env={"STORM_FK": FLEET_KEY, "STORM_SALT": SALT})
    before = plane.memory()
    crowd = clients([box_name(i) for i in range(BOXES)], WRONG_KEYS, MADE_UP, spread_s=1.0)
    storm = asyncio.run(run_storm(plane.url, crowd))
    after = plane.memory()

    assert not storm.errors, storm.errors
    assert dict(storm.answers) == {("box", 200): BOXES, ("wrong-key", 403): WRONG_KEYS, ("made-up", 404): MADE_UP}
    assert storm.wrong_bodies == []
    assert storm.installer_ok == BOXES
    status, attention = plane.json("/admin/attention", {"Authorization": f"Bearer {VIEWER_TOKEN}"})
    assert status == 200
    assert len(attention["entries"]) == CAP
    assert all(e["box"].startswith("made-up-") for e in attention["entries"])
    metrics = plane.get("/metrics")[2].decode()
    assert f"fleetllm_attention_entries {CAP:.1f}" in metrics
    assert f"fleetllm_attention_evicted_total {MADE_UP - CAP:.1f}" in metrics
    assert after.peak_mib - before.rss_mib < MAX_GROWTH_MIB, (before, after)

    assert plane.stop() == 0  # a graceful stop writes out the buffered fetch log
    store = open_store(f"sqlite:///{state}")
    try:
        recorded = store.recent_fetches(limit=10 * BOXES)
    finally:
        store.close()
    assert len(recorded) == 2 * BOXES + WRONG_KEYS + MADE_UP
    figures(case="boot storm", **storm.summary(), attention_entries=len(attention["entries"]),
            rss_before_mib=before.rss_mib, rss_after_mib=after.rss_mib, peak_mib=after.peak_mib,
            fetch_records=len(recorded))
