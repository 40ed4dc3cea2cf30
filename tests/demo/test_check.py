"""The demo's final checks and its table, over pass outcomes built by the reconciler's own planner."""

from __future__ import annotations

from collections.abc import Iterable

from rich.table import Table

from fleetllm.adapters.state.reconcile import PassRecord
from fleetllm.core.judge.intended import IntendedServer
from fleetllm.core.judge.observed import BoxFacts, Deployment, ProbeResult
from fleetllm.core.judge.plan import make_plan
from fleetllm.demo.check import arrived, problems, waiting_for
from fleetllm.demo.move import Move
from fleetllm.demo.view import rows, table
from fleetllm.job.engine import PassOutcome
from tests.reconcile.builders import (
    NOW,
    assessed,
    deployment_for,
    failed,
    intended,
    observation,
    ok,
    server,
)

A = server("127.0.0.2", 8001, "m")
B = server("127.0.0.3", 8003, "n")
OLD_B = server("127.0.0.2", 8003, "n")
RUNNING = {"127.0.0.2": {"fleetllm-m": "RUNNING"}, "127.0.0.3": {"fleetllm-n": "RUNNING"}}
MOVE = Move("n", "n", "127.0.0.2", 8003, "127.0.0.3", 8003)


def outcome(servers: Iterable[IntendedServer], probes: dict[tuple[str, int], ProbeResult],
            deployments: Iterable[Deployment] | None) -> PassOutcome:
    wanted = intended(servers)
    facts = {s.box: BoxFacts(fetched_at=NOW - 30) for s in wanted.servers.values()}
    obs = observation(wanted, probes, deployments, facts=facts)
    plan = make_plan(wanted, obs, assessed(wanted, obs))
    record = PassRecord(started_at=NOW, duration_s=0.1, revision=wanted.revision, mode="apply", verdicts={})
    return PassOutcome(wanted, plan, (), record, obs)


def test_in_step_with_litellm() -> None:
    done = outcome([A, B], {A.key: ok(A), B.key: ok(B)}, [deployment_for(A), deployment_for(B)])
    assert waiting_for(done, applying=True) == []
    assert problems(done, RUNNING, MOVE, applying=True) == []


def test_a_loading_server_and_a_missing_deployment_are_waited_for() -> None:
    done = outcome([A, B], {A.key: ok(A), B.key: failed()}, [])
    waiting = waiting_for(done, applying=True)
    assert any("127.0.0.3:8003 n is Loading" in w for w in waiting)
    assert any("create fleetllm:127.0.0.2:8001" in w for w in waiting)
    assert waiting_for(done, applying=True)
    # Plan only: LiteLLM is not part of the goal, the verdicts are.
    assert waiting_for(done, applying=False) == ["127.0.0.3:8003 n is Loading"]


def test_plan_only_converges_on_verdicts_alone() -> None:
    done = outcome([A, B], {A.key: ok(A), B.key: ok(B)}, [])
    assert waiting_for(done, applying=False) == []
    assert waiting_for(done, applying=True)


def test_the_old_deployment_and_the_old_program_are_problems() -> None:
    done = outcome([A, B], {A.key: ok(A), B.key: ok(B)}, [deployment_for(A), deployment_for(B), deployment_for(OLD_B)])
    states = {"127.0.0.2": {"fleetllm-m": "RUNNING", "fleetllm-n": "RUNNING"}, "127.0.0.3": {"fleetllm-n": "RUNNING"}}
    found = problems(done, states, MOVE, applying=True)
    assert "127.0.0.2 still runs n (its installer did not remove it)" in found
    assert "LiteLLM still routes n to 127.0.0.2:8003" in found
    assert any("delete fleetllm:127.0.0.2:8003" in f for f in found)


def test_a_move_that_did_not_happen() -> None:
    done = outcome([A, OLD_B], {A.key: ok(A), OLD_B.key: ok(OLD_B)}, [deployment_for(A), deployment_for(OLD_B)])
    found = problems(done, {"127.0.0.2": {"fleetllm-m": "RUNNING", "fleetllm-n": "RUNNING"}}, MOVE, applying=True)
    assert "the repository does not place n on 127.0.0.3:8003" in found
    assert "the repository still places a server on 127.0.0.2:8003" in found
    assert "LiteLLM does not route n to http://127.0.0.3:8003/v1" in found


def test_a_program_supervisor_does_not_run_is_a_problem() -> None:
    done = outcome([A, B], {A.key: ok(A), B.key: ok(B)}, [deployment_for(A), deployment_for(B)])
    found = problems(done, {"127.0.0.2": {"fleetllm-m": "FATAL"}, "127.0.0.3": None}, None, applying=True)
    assert found == ["127.0.0.2:8001 m: Supervisor says FATAL", "127.0.0.3:8003 n: Supervisor says no such program"]


def test_rows_show_each_server_and_a_removed_servers_deployment() -> None:
    done = outcome([A, B], {A.key: ok(A), B.key: failed()}, [deployment_for(A), deployment_for(OLD_B)])
    states = {"127.0.0.2": {"fleetllm-m": "RUNNING", "fleetllm-n": "STOPPED"}, "127.0.0.3": None}
    found = rows(done, states, applying=True)
    assert [(r.box, r.port, r.verdict, r.supervisor, r.litellm) for r in found] == [
        ("127.0.0.2", 8001, "Healthy", "RUNNING", "deployed"),
        ("127.0.0.3", 8003, "Loading", "no supervisord", "-"),
        ("127.0.0.2", 8003, "-", "STOPPED", "- delete"),
    ]
    # Still serving while n's new server loads: the old deployment is held, not deleted.
    held = outcome([A, B], {A.key: ok(A), B.key: failed()}, [deployment_for(A), deployment_for(OLD_B)])
    obs = observation(held.intended, {A.key: ok(A), B.key: failed()}, [deployment_for(A), deployment_for(OLD_B)],
                      facts={"127.0.0.2": BoxFacts(fetched_at=NOW - 30), "127.0.0.3": BoxFacts(fetched_at=NOW - 30)},
                      orphan_probes={OLD_B.id: ok(OLD_B)})
    plan = make_plan(held.intended, obs, assessed(held.intended, obs))
    kept = rows(PassOutcome(held.intended, plan, (), held.record, obs), states, applying=True)
    assert kept[2].litellm == "held"
    planned = rows(outcome([A], {A.key: ok(A)}, []), {}, applying=False)
    assert planned[0].litellm == "+ would create"
    wide = table(found)
    assert isinstance(wide, Table) and wide.row_count == 3


def test_the_moved_server_has_arrived_when_healthy_and_deployed() -> None:
    loading = outcome([A, B], {A.key: ok(A), B.key: failed()}, [deployment_for(A), deployment_for(OLD_B)])
    assert arrived(loading, MOVE, applying=False) == ["127.0.0.3:8003 n is Loading"]
    serving = outcome([A, B], {A.key: ok(A), B.key: ok(B)}, [deployment_for(A), deployment_for(OLD_B)])
    assert arrived(serving, MOVE, applying=False) == []
    assert arrived(serving, MOVE, applying=True) == ["LiteLLM has no deployment fleetllm:127.0.0.3:8003 yet"]
    deployed = outcome([A, B], {A.key: ok(A), B.key: ok(B)}, [deployment_for(A), deployment_for(B)])
    assert arrived(deployed, MOVE, applying=True) == []


def test_a_server_healthy_only_by_hysteresis_fails_the_check() -> None:
    # The final table of a real `demo --once` run: Healthy, "GET /health: connect call failed ...; 2 failed
    # probe(s) in a row". The verdict is still Healthy (Down after 3), but the fleet is not where it should be.
    done = outcome([A, B], {A.key: ok(A), B.key: failed()}, [deployment_for(A), deployment_for(B)])
    assert done.plan.judgements[B.key].verdict.value == "Healthy"
    assert "failed probe(s) in a row" in done.plan.judgements[B.key].reason
    for applying in (True, False):
        found = problems(done, RUNNING, None, applying=applying)
        assert len(found) == 1, found
        assert found[0].startswith(f"{B} fails its probes (still Healthy until Down): ")
    assert waiting_for(done, applying=False) == problems(done, RUNNING, None, applying=False)
