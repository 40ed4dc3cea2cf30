"""The control plane's durable state: fetch log, attention list, box reports, approvals, reconcile passes."""

from reconciler.state.records import Approval, AttentionEntry, BoxReport, Endpoint, FetchRecord, Outcome, Sighting
from reconciler.state.store import StateError, StateStore, open_store

__all__ = ["Approval", "AttentionEntry", "BoxReport", "Endpoint", "FetchRecord", "Outcome", "Sighting",
           "StateError", "StateStore", "open_store"]
