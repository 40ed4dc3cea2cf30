"""Whether the simulated fleet is where it should be: pure checks over a pass outcome and the boxes'
Supervisor states. `waiting_for` and `arrived` say when to stop waiting; `problems` is the final verdict
of --once."""

from __future__ import annotations

from fleetllm.core.judge.intended import ServerKey, deployment_id
from fleetllm.core.judge.observed import FAILED_PROBES
from fleetllm.core.judge.verdict import Verdict
from fleetllm.demo.move import Move
from fleetllm.demo.view import PROGRAM_PREFIX, BoxStates
from fleetllm.job.engine import PassOutcome


def failing_probes(outcome: PassOutcome, key: ServerKey) -> bool:
    """A server still judged Healthy by hysteresis whose probe failed this pass: not where it should be."""
    probe = outcome.observation.probes.get(key)
    return probe is not None and probe.status in FAILED_PROBES


def waiting_for(outcome: PassOutcome, *, applying: bool) -> list[str]:
    """What the fleet still lacks: servers not Healthy (or Healthy only by hysteresis, failing their
    probes) and, with LiteLLM, deployments not in step."""
    missing: list[str] = []
    for key, server in sorted(outcome.intended.servers.items()):
        judgement = outcome.plan.judgements[key]
        if judgement.verdict is not Verdict.HEALTHY:
            missing.append(f"{server} is {judgement.verdict}")
        elif failing_probes(outcome, key):
            missing.append(f"{server} fails its probes (still {judgement.verdict} until Down): {judgement.reason}")
    if applying:
        missing += [f"LiteLLM: {action.kind} {action.id} planned" for action in outcome.plan.actions]
        missing += [f"LiteLLM: {held.kind} {held.id} held" for held in outcome.plan.held]
        missing += [f"observation failed: {error}" for error in outcome.plan.errors]
        managed = {d.id for d in outcome.observation.deployments or () if d.managed}
        intended = {s.id for s in outcome.intended.servers.values()}
        missing += [f"LiteLLM has no deployment {i}" for i in sorted(intended - managed)]
        missing += [f"LiteLLM still has {i}" for i in sorted(managed - intended)]
    return missing


def arrived(outcome: PassOutcome, move: Move, *, applying: bool) -> list[str]:
    """What the moved server still lacks at its new place: Healthy, and with LiteLLM its deployment."""
    key = (move.target, move.target_port)
    judgement = outcome.plan.judgements.get(key)
    if judgement is None or judgement.verdict is not Verdict.HEALTHY:
        return [f"{move.target}:{move.target_port} {move.model} is {judgement.verdict if judgement else 'not placed'}"]
    managed = {d.id for d in outcome.observation.deployments or () if d.managed}
    if applying and deployment_id(*key) not in managed:
        return [f"LiteLLM has no deployment {deployment_id(*key)} yet"]
    return []


def problems(outcome: PassOutcome | None, states: BoxStates, move: Move | None, *, applying: bool) -> list[str]:
    """Everything wrong with the final state; empty when the demo ended where it should."""
    if outcome is None:
        return ["no reconcile pass ran"]
    found = waiting_for(outcome, applying=applying)
    for key, server in outcome.intended.servers.items():
        state = (states.get(server.box) or {}).get(PROGRAM_PREFIX + server.name)
        if state != "RUNNING":
            found.append(f"{key[0]}:{key[1]} {server.name}: Supervisor says {state or 'no such program'}")
    if move is None:
        return found
    servers = outcome.intended.servers
    target = servers.get((move.target, move.target_port))
    if target is None or target.model != move.model:
        found.append(f"the repository does not place {move.model} on {move.target}:{move.target_port}")
    if (move.source, move.source_port) in servers:
        found.append(f"the repository still places a server on {move.source}:{move.source_port}")
    if PROGRAM_PREFIX + move.name in (states.get(move.source) or {}):
        found.append(f"{move.source} still runs {move.name} (its installer did not remove it)")
    if applying:
        deployments = {d.id: d for d in outcome.observation.deployments or ()}
        moved = deployments.get(deployment_id(move.target, move.target_port))
        expected = f"http://{move.target}:{move.target_port}/v1"
        if moved is None or moved.recorded_api_base != expected:
            found.append(f"LiteLLM does not route {move.model} to {expected}")
        if deployment_id(move.source, move.source_port) in deployments:
            found.append(f"LiteLLM still routes {move.model} to {move.source}:{move.source_port}")
    return found
