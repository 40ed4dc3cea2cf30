"""Rotating the salt box by box (secrets.previous_vllm_api_salt): a server whose box has not restarted
yet still runs the previous salt's bearer; it stays routed with that bearer (judged Stale: restart the
box), and moves to the new bearer once its box restarted. A failed probe never switches the bearer."""

from __future__ import annotations

import asyncio

from fleetllm.adapters.litellm import LitellmClient
from fleetllm.adapters.state.reconcile import MemoryStore
from fleetllm.core.fleet.bearer import Salt, bearer_fingerprint
from fleetllm.core.fleet.render import Bearers
from fleetllm.core.judge.assess import assess
from fleetllm.core.judge.intended import INFO_BEARER, intended_state
from fleetllm.core.judge.observed import Deployment
from fleetllm.core.judge.verdict import ServerHistory, Verdict
from fleetllm.core.secret import Secret
from fleetllm.job.engine import Reconciler
from fleetllm.job.observer import Observer

from .builders import NOW, failed, observation
from .fakes import FakeLitellmHttp, FakeServer, FakeVllm, serve
from .test_engine import fleet

OLD = Salt("old12chars!!")  # the short salt an llmao fleet ran on
NEW = Salt("a-new-and-much-longer-salt-0123456789")


def test_rotation_box_by_box_keeps_every_server_routed() -> None:
    litellm = FakeLitellmHttp()
    vllm = FakeVllm()

    async def scenario() -> None:
        async with serve(litellm.app()) as (lport,), serve(vllm.app(), [0, 0]) as (p1, p2):
            vllm.servers[p1] = FakeServer("m", OLD.derive("127.0.0.1", p1), "org/m")  # not restarted yet
            vllm.servers[p2] = FakeServer("m", NEW.derive("127.0.0.1", p2), "org/m")  # restarted
            two = fleet([p1, p2])

            def reconciler(bearers: Bearers) -> Reconciler:
                return Reconciler(bearers, Observer({}, 2, 8),
                                  lambda s: LitellmClient(s, f"http://127.0.0.1:{lport}", Secret(litellm.master_key, "test")),
                                  MemoryStore())

            without = await reconciler(Bearers(NEW)).run_pass(two, apply=False)
            assert without.plan.judgements[("127.0.0.1", p1)].verdict is Verdict.FOREIGN

            rotating = reconciler(Bearers(NEW, previous_salt=OLD))
            first = await rotating.run_pass(two, apply=True)
            judged = first.plan.judgements
            assert judged[("127.0.0.1", p1)].verdict is Verdict.STALE
            assert "previous salt" in judged[("127.0.0.1", p1)].reason
            assert judged[("127.0.0.1", p2)].verdict is Verdict.HEALTHY
            keys = {ident: row["litellm_params"]["api_key"] for ident, row in litellm.rows.items()}
            assert keys == {f"fleetllm:127.0.0.1:{p1}": OLD.derive("127.0.0.1", p1),
                            f"fleetllm:127.0.0.1:{p2}": NEW.derive("127.0.0.1", p2)}

            vllm.servers[p1] = FakeServer("m", NEW.derive("127.0.0.1", p1), "org/m")  # its box restarted
            second = await rotating.run_pass(two, apply=True)
            assert second.plan.judgements[("127.0.0.1", p1)].verdict is Verdict.HEALTHY
            assert [(a.kind, a.id) for a in second.plan.actions] == [("update", f"fleetllm:127.0.0.1:{p1}")]
            assert litellm.rows[f"fleetllm:127.0.0.1:{p1}"]["litellm_params"]["api_key"] == NEW.derive(
                "127.0.0.1", p1)

    asyncio.run(scenario())


def test_a_failed_probe_keeps_the_bearer_the_deployment_has() -> None:
    from fleetllm.core.fleet.model import Box, Fleet, FleetSettings, Recipe, ServerRow, VllmRecipe, frozen_map

    recipes = {"m": Recipe("m", VllmRecipe(model="org/m", served_model_name="m", max_model_len=4096))}
    boxes = {"127.0.0.2": Box("127.0.0.2", (ServerRow("m", 8001, "m"),))}
    one = Fleet("f" * 40, FleetSettings(), frozen_map(recipes), frozen_map(boxes))
    want = intended_state(one, Bearers(NEW, previous_salt=OLD))
    server = want.servers[("127.0.0.2", 8001)]
    on_old = Deployment(server.id, "m", {"managed_by": "fleetllm", INFO_BEARER: bearer_fingerprint(
        OLD.derive("127.0.0.2", 8001))})
    up = {server.key: ServerHistory(first_seen=NOW - 600, up=True, ever_up=True, ok_streak=3, recent="111")}
    seen = observation(want, {server.key: failed()}, [on_old])
    assessment = assess(want, seen, up)
    assert assessment.judgements[server.key].verdict is Verdict.HEALTHY  # one failure: hysteresis
    assert assessment.desired[server.key].model_info[INFO_BEARER] == bearer_fingerprint(OLD.derive("127.0.0.2", 8001))
