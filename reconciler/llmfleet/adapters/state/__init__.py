"""The durable state of the control plane and the reconciler (fetch log, attention list, box reports,
approvals, probe histories, pending deletes, passes), on SQLite or PostgreSQL."""

from llmfleet.adapters.state.records import (
           Approval,
           AttentionEntry,
           BoxReport,
           Endpoint,
           FetchRecord,
           Outcome,
           Sighting,
)
from llmfleet.adapters.state.store import FetchRetention, StateError, StateStore, open_store

__all__ = ["Approval", "AttentionEntry", "BoxReport", "Endpoint", "FetchRecord", "FetchRetention", "Outcome",
           "Sighting", "StateError", "StateStore", "open_store"]
