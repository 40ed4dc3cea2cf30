"""Judge every intended server of one pass: resolve its endpoint, advance its history with this pass's
probe, give it a verdict, and say which deployment it should have. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from fleetllm.core.fleet.bearer import bearer_fingerprint
from fleetllm.core.judge.intended import DeploymentSpec, Intended, IntendedServer, ServerKey, desired_deployment
from fleetllm.core.judge.observed import BoxFacts, Deployment, Observation, ProbeResult, ProbeStatus
from fleetllm.core.judge.ownership import claim_of, writable
from fleetllm.core.judge.verdict import (
    Judgement,
    ServerHistory,
    Verdict,
    advance,
    judge,
    note_fetch,
    outcome_of,
    seeded_history,
)


@dataclass(frozen=True)
class Assessment:
    judgements: Mapping[ServerKey, Judgement]
    histories: Mapping[ServerKey, ServerHistory]  # to persist after an applied pass
    desired: Mapping[ServerKey, DeploymentSpec]  # servers whose public endpoint is known


NO_FACTS = BoxFacts()


def assess(intended: Intended, observation: Observation, histories: Mapping[ServerKey, ServerHistory]) -> Assessment:
    now = observation.observed_at
    claim = claim_of(intended)
    listed = {d.id: d for d in observation.deployments or () if writable(d, claim)}
    managed_ids = set(listed)
    judgements: dict[ServerKey, Judgement] = {}
    advanced: dict[ServerKey, ServerHistory] = {}
    desired: dict[ServerKey, DeploymentSpec] = {}
    for key, server in sorted(intended.servers.items()):
        resolution = observation.resolutions[key]
        probe = observation.probes.get(key)
        history = histories.get(key) or seeded_history(now, serving=server.id in managed_ids)
        facts = observation.boxes.get(server.box, NO_FACTS)
        history = advance(history, outcome_of(resolution, probe), now, intended.settings)
        advanced[key] = note_fetch(history, facts.fetched_at)
        judgement = judge(server, resolution, probe, history, facts, intended.settings, now)
        routed = server
        if server.previous_bearer is not None and _on_previous_salt(server, probe, listed.get(server.id)):
            # a salt rotation in progress: routed with the bearer it still runs until its box restarts
            routed = dataclasses.replace(server, bearer=server.previous_bearer)
            if judgement.verdict is Verdict.HEALTHY and probe is not None and probe.previous_salt:
                judgement = Judgement(Verdict.STALE, "serves with the previous salt's bearer "
                                      "(secrets.previous_vllm_api_salt): restart the box to move it to the new salt")
        if resolution.assumed:
            judgement = Judgement(judgement.verdict, f"{judgement.reason} [{resolution.note}]")
        judgements[key] = judgement
        if resolution.endpoint is not None:
            desired[key] = desired_deployment(routed, resolution.endpoint, intended.revision, intended.fleet_id)
    return Assessment(judgements, advanced, desired)


def _on_previous_salt(server: IntendedServer, probe: ProbeResult | None, existing: Deployment | None) -> bool:
    """Whether to route a server with the previous salt's bearer: it accepted only that one this pass, or
    this pass proved nothing (a failed probe) and its deployment already carries it: a blip must not
    switch LiteLLM to a bearer the server refuses."""
    if probe is not None and probe.status is ProbeStatus.OK:
        return probe.previous_salt
    return (existing is not None and server.previous_bearer is not None
            and existing.recorded_bearer == bearer_fingerprint(server.previous_bearer))
