"""The machine-readable report.

`format_version` is MAJOR.MINOR: a minor bump only adds keys, a major bump changes or removes them.
A field absent on one side of a change has no `before` (or `after`) key; an explicit null is `null`.
Top-level keys a later version may add (a minor bump): `plan`, the reconciler's plan for HEAD against
the live observation, attached by `fleetllm plan --against`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from fleetllm.core.diff.report import (
    ASSUMED_LOAD_S,
    Absent,
    DeploymentChange,
    FieldChange,
    Report,
    ServerChange,
    ServerRef,
)
from fleetllm.core.diff.sections import box_verdict
from fleetllm.core.diff.summary import counts, summary_line
from fleetllm.core.fleet.jsonvalue import JSON

FORMAT_VERSION = "1.1"  # 1.1: boxes[].redivided and card_known, disruptions
KIND = "fleetllm-diff"


def fields_json(fields: Iterable[FieldChange]) -> list[JSON]:
    out: list[JSON] = []
    for f in fields:
        item: dict[str, JSON] = {"path": list(f.path), "lifetime": f.lifetime.value}
        if not isinstance(f.before, Absent):
            item["before"] = f.before
        if not isinstance(f.after, Absent):
            item["after"] = f.after
        out.append(item)
    return out


def ref_json(ref: ServerRef | None) -> JSON:
    return None if ref is None else {"box": ref.box, "port": ref.port, "name": ref.name, "model": ref.model}


def server_json(change: ServerChange) -> JSON:
    return {"action": change.action.value, "before": ref_json(change.before), "after": ref_json(change.after),
            "fields": fields_json(change.fields), "new_bearer": change.bearer is not None}


def deployment_json(change: DeploymentChange) -> JSON:
    return {"action": change.action.value, "box": change.box, "port": change.port,
            "before": change.before.as_json() if change.before else None,
            "after": change.after.as_json() if change.after else None,
            "fields": fields_json(change.fields), "paused": change.paused}


def report_json(report: Report, extra: Mapping[str, JSON] | None = None) -> dict[str, JSON]:
    doc: dict[str, JSON] = {
        "format_version": FORMAT_VERSION,
        "kind": KIND,
        "valid": True,
        "base": {"revision": report.base},
        "head": {"revision": report.head},
        "changed": report.changed,
        "summary": summary_line(report),
        "counts": dict(counts(report)),
        "allowed_options": [{"model": a.model, "option": a.option, "effect": a.effect, "used": a.used,
                             "servers": a.servers} for a in report.allowed],
        "alerts": [{"level": a.level.value, "code": a.code, "subject": a.subject, "message": a.message}
                   for a in report.alerts],
        "boxes": [{"name": b.name, "status": b.status.value, "instruction": box_verdict(b),
                   "start": list(b.start), "restart": list(b.restart), "stop": list(b.stop),
                   "details": fields_json(b.details), "paused": b.paused, "redivided": list(b.redivided),
                   "card_known": b.card_known} for b in report.boxes],
        "servers": [server_json(s) for s in report.servers],
        "deployments": [deployment_json(d) for d in report.deployments],
        "bearers": [{"box": b.server.box, "port": b.server.port, "name": b.server.name, "model": b.server.model,
                     "before": b.before, "after": b.after} for b in report.bearers],
        "recipes": [{"model": r.model, "action": r.action, "servers": r.servers, "fields": fields_json(r.fields)}
                    for r in report.recipes],
        "settings": fields_json(report.settings),
        "disruptions": [{"model": d.model, "restarting": [ref_json(r) for r in d.restarting], "serving": d.serving,
                         "seconds": d.seconds, "out_at_once": d.out_at_once,
                         "assumed_load_s": ASSUMED_LOAD_S} for d in report.disruptions],
    }
    if extra:
        doc.update(extra)
    return doc


def render_json(report: Report, extra: Mapping[str, JSON] | None = None) -> str:
    return json.dumps(report_json(report, extra), indent=2, ensure_ascii=False) + "\n"
