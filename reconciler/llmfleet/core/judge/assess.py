"""Judge every intended server of one pass: resolve its endpoint, advance its history with this pass's
probe, give it a verdict, and say which deployment it should have. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from llmfleet.core.judge.intended import DeploymentSpec, Intended, ServerKey, desired_deployment
from llmfleet.core.judge.observed import BoxFacts, Observation
from llmfleet.core.judge.verdict import (
    Judgement,
    ServerHistory,
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
    managed_ids = {d.id for d in observation.deployments or () if d.managed}
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
        judgements[key] = judge(server, resolution, probe, history, facts, intended.settings, now)
        if resolution.endpoint is not None:
            desired[key] = desired_deployment(server, resolution.endpoint, intended.revision)
    return Assessment(judgements, advanced, desired)
