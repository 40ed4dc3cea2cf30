"""A pass run while the fleet is suspended is recorded, shown and counted as such (mode "suspended"), not as
a dry run: the real Reconciler on the real SQLite store, the status pages and the pass metrics."""

from __future__ import annotations

from pathlib import Path

from fleetllm.job.metrics import PassMetrics
from tests.pages.conftest import LogCapture, build_world, login
from tests.pages.scenario import Stubs, run_passes
from tests.server.conftest import VIEWER_TOKEN


def test_a_suspended_pass_is_told_apart_from_a_dry_run(tmp_path: Path, logs: LogCapture) -> None:
    world = build_world(tmp_path, passes=0)
    try:
        served = world.runtime.tracker.served
        assert served is not None
        seeded = dict(world.litellm.rows)
        (dry,) = run_passes(world.state, served.fleet, world.litellm, Stubs(world.ports), world.clock, 1,
                            apply=False)
        world.runtime.store.suspend("admin:sha256:0a1b2c3d", world.clock.now, "LiteLLM upgrade")
        (held,) = run_passes(world.state, served.fleet, world.litellm, Stubs(world.ports), world.clock, 1,
                             apply=False, suspended=True)
        assert world.litellm.rows == seeded  # neither wrote
        assert (dry.record.mode, held.record.mode) == ("plan", "suspended")
        assert held.record.actions, "the scenario plans writes"

        client = world.app.test_client()
        login(client, VIEWER_TOKEN)
        passes = client.get("/api/passes").get_json()["passes"]
        assert [p["mode"] for p in passes] == ["suspended", "plan"]
        fleet = client.get("/").get_data(as_text=True)
        assert "the fleet was suspended: LiteLLM was not written" in fleet and "a dry run" not in fleet
        history = client.get("/history").get_data(as_text=True)
        assert "suspended: nothing written" in history and "dry run: nothing written" in history
        assert 'class="failed"' not in history  # held actions are not failed writes

        metrics = PassMetrics()
        for outcome in (dry, held):
            metrics.observe(outcome.record)
        by_result: dict[str, float] = {}
        for family in metrics.registry.collect():
            for s in family.samples:
                if s.name == "fleetllm_reconcile_actions_total":
                    by_result[s.labels["result"]] = by_result.get(s.labels["result"], 0.0) + s.value
        assert by_result == {"planned": len(dry.record.actions), "suspended": len(held.record.actions)}
    finally:
        world.runtime.stop()
