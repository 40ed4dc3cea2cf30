"""What a reconcile pass sets on the fleet repository's forge: the commit status of each revision whose
rollout moved in the pass (fleetllm.core.forge says which state and words), through the sender of
fleetllm.adapters.forge, which never holds the pass up. A pass that does not record its step (a dry run,
a suspension) has no transition, so it sets nothing."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from fleetllm.adapters.forge import CommitStatuses
from fleetllm.adapters.state.passes import PassRecord
from fleetllm.core.forge import CommitStatus, ForgeConfig, commit_status


def make_statuses(config: ForgeConfig, registry: CollectorRegistry | None = None) -> CommitStatuses:
    return CommitStatuses(config, registry=registry)


def pass_statuses(record: PassRecord, config: ForgeConfig) -> list[CommitStatus]:
    """The statuses of the rollout's transitions the pass recorded, in the order they happened."""
    if record.rollout is None:
        return []
    return [commit_status(change, config.context, config.control_plane_url) for change in record.rollout.changes]


def post_statuses(statuses: CommitStatuses, record: PassRecord) -> None:
    for status in pass_statuses(record, statuses.config):
        statuses.post(status)


__all__ = ["make_statuses", "pass_statuses", "post_statuses"]
