"""Operator endpoints: the push webhook, and JSON views and actions for viewer and admin tokens.

    POST /hooks/push        GitHub-style webhook (X-Hub-Signature-256), refreshes the tracked branch
    GET  /admin/attention   unknown boxes that presented the fleet key          (viewer and up)
    GET  /admin/reports     each box's latest report, and whether it is stale   (viewer and up)
    GET  /admin/fetches     the fetch log, newest first (?box=&limit=&before=)  (viewer and up)
    GET  /admin/approvals   approvals made through this control plane          (viewer and up)
    POST /admin/approve     {"host": ..., "models": [...]}: commit the box      (admin)

The credentials are checked by `requires(role)` (Authorization: Bearer only); refusals are JSON (errors.py).
An approval records who made it (the token's name or fingerprint, or the person signed in).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from typing import Any

from flask import Blueprint, Response, jsonify, request, url_for

from fleetllm.adapters.approve import Approved, ApproveError, approve
from fleetllm.adapters.state.records import Approval
from fleetllm.core.fleet.model import Provider
from fleetllm.logs import get_logger, log_event
from fleetllm.server.access import current_caller, requires
from fleetllm.server.auth import Role, webhook_signature_ok
from fleetllm.server.errors import error
from fleetllm.server.params import ParamError, int_param
from fleetllm.server.reports import report_json, staleness
from fleetllm.server.runtime import Runtime, current_runtime
from fleetllm.settings import ApproveTarget

PROVIDERS = tuple(p.value for p in Provider)
log = get_logger("admin")
DEFAULT_LIMIT, MAX_LIMIT = 100, 1000
MAX_HOOK_BYTES = 5 * 1024 * 1024  # a push event for a fleet repository is a few KiB
MAX_APPROVE_BYTES = 64 * 1024
bp = Blueprint("admin", __name__)


@bp.post("/hooks/push")
def push_hook() -> Response:
    """Authenticated by the webhook's signature, not a token: 404 when webhooks are off, 403 when the
    signature is missing or wrong."""
    rt = current_runtime()
    cfg = rt.config
    secret = cfg.repo.webhook_secret
    if secret is None:
        return error(404, "webhooks are off: set repo.webhook_secret")
    request.max_content_length = MAX_HOOK_BYTES
    body = request.get_data(cache=False)
    if not webhook_signature_ok(secret, body, request.headers.get("X-Hub-Signature-256")):
        log_event(log, "webhook signature rejected", logging.WARNING, peer=request.remote_addr)
        return error(403, "bad or missing X-Hub-Signature-256")
    if request.headers.get("X-GitHub-Event") == "ping":
        return jsonify({"status": "pong"})
    try:
        ref = json.loads(body or b"{}").get("ref")
    except (ValueError, AttributeError):
        ref = None
    if isinstance(ref, str) and ref != f"refs/heads/{cfg.repo.branch}":
        return jsonify({"status": "ignored", "reason": f"{ref} is not the tracked branch"})
    changed = rt.tracker.refresh()
    served = rt.tracker.served
    status = rt.tracker.refresh_status
    log_event(log, "webhook refresh", changed=changed, revision=served.revision if served else None,
              error=status.error)
    if status.error is not None:
        return error(502, f"refresh failed: {status.error}")
    return jsonify({"status": "refreshed", "changed": changed, "revision": served.revision if served else None})


@bp.get("/admin/attention")
@requires(Role.VIEWER)
def attention() -> Response:
    rt = current_runtime()
    served = rt.tracker.served
    placed = served.fleet.boxes if served else {}
    leaving = rt.store.retirements()  # a box that left the placement is retired, never unknown (as on the pages)
    return jsonify({"entries": [asdict(e) for e in rt.store.attention()
                                if e.box not in placed and e.box not in leaving],
                    "max_entries": rt.config.attention_max_entries})


@bp.get("/admin/reports")
@requires(Role.VIEWER)
def reports() -> Response:
    rt = current_runtime()
    served = rt.tracker.served
    out: dict[str, Any] = {}
    for box, report in sorted(rt.store.latest_reports().items()):
        rendered = served.boxes.get(box) if served else None
        out[box] = {**report_json(report),
                    "staleness": staleness(report, json.loads(rendered.body)) if rendered else None}
    return jsonify({"served_revision": served.revision if served else None, "boxes": out})


@bp.get("/admin/fetches")
@requires(Role.VIEWER)
def fetches() -> Response:
    try:
        limit = int_param(request.args, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT) or DEFAULT_LIMIT
        before = int_param(request.args, "before", None, 1, 2**62)
    except ParamError as exc:
        return error(400, str(exc))
    box = request.args.get("box")
    records = current_runtime().store.recent_fetches(box=box, limit=limit, before=before)
    # Paging: records are bounded in size (records.STORED_CHARS), so a page is at most
    # MAX_LIMIT * MAX_RECORD_CHARS of text; `next` asks for the older ones.
    last = records[-1].id if len(records) == limit else None
    query: dict[str, Any] = {"limit": limit, "before": last} if box is None else \
        {"box": box, "limit": limit, "before": last}
    following = None if last is None else url_for(".fetches", **query)
    return jsonify({"fetches": [asdict(r) for r in records], "limit": limit, "next": following})


@bp.get("/admin/approvals")
@requires(Role.VIEWER)
def approvals() -> Response:
    return jsonify({"approvals": [asdict(a) for a in current_runtime().store.approvals()]})


@bp.post("/admin/approve")
@requires(Role.ADMIN, action="Approving a box")
def approve_box() -> Response:
    rt = current_runtime()
    request.max_content_length = MAX_APPROVE_BYTES
    payload = request.get_json(silent=True)
    host = payload.get("host") if isinstance(payload, dict) else None
    models = payload.get("models") if isinstance(payload, dict) else None
    provider = payload.get("provider") if isinstance(payload, dict) else None
    if not isinstance(host, str) or not host or not isinstance(models, list) or not models \
            or not all(isinstance(m, str) for m in models) or provider not in (None, *PROVIDERS):
        return error(400, 'send JSON {"host": "<box name>", "models": ["<model>", ...], '
                          '"provider": "vast" | "runpod" | "static" (optional)}')
    try:
        done = approve_and_record(rt, host, models, current_caller().actor,
                                  Provider(provider) if provider else None)
    except ApproveError as exc:
        return error(409, str(exc))
    return jsonify({"host": done.host, "branch": done.branch, "commit": done.commit, "base": done.base,
                    "repository": str(rt.repo.git_dir), "servers": [asdict(r) for r in done.rows]})


def approve_and_record(rt: Runtime, host: str, models: list[str], actor: str,
                       provider: Provider | None = None) -> Approved:
    """The git change of `fleetllm approve`, recorded for the audit trail (POST /admin/approve and the
    status pages' Approve). Raises ApproveError with what to do."""
    cfg = rt.config
    sighting = next((e for e in rt.store.attention() if e.box == host), None)
    note = (f"Approved through the control plane; fleet key presented {sighting.count} time(s), last from "
            f"{sighting.peer}") if sighting else "Approved through the control plane"
    onto_tracked = cfg.repo.approve_target is ApproveTarget.TRACKED
    with rt.tracker.git_lock:
        done = approve(rt.repo.fleet_repo, host, models, base_branch=cfg.repo.branch, onto_tracked=onto_tracked,
                       note=note, provider=provider)
    rt.store.record_approval(Approval(rt.clock(), done.host, tuple(models), done.branch, done.commit, done.base,
                                      actor))
    log_event(log, "box approved", host=done.host, models=models, branch=done.branch, commit=done.commit,
              actor=actor)
    if onto_tracked:
        rt.tracker.refresh()
    return done
