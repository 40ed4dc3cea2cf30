"""Box reports (POST /vllm/report): parse and validate against schemas/box-report.schema.json."""

from __future__ import annotations

import json
from typing import Any

from jsonschema.exceptions import best_match

from llmfleet.adapters.state.records import BoxReport
from llmfleet.core.fleet.diagnostics import pointer
from llmfleet.core.fleet.jsonvalue import freeze_mapping, thaw
from llmfleet.core.fleet.schema import validator
from llmfleet_contract.report import ReportOutcome

MAX_REPORT_BYTES = 64 * 1024
SCHEMA = "box-report"


class ReportError(ValueError):
    """The report is not acceptable; the message says where and why (sent back as a 400)."""


def _no_constants(name: str) -> None:
    raise ReportError(f"{name} is not a JSON number")


def parse_report(body: bytes, box: str, peer: str, received_at: float) -> BoxReport:
    try:
        document: Any = json.loads(body.decode("utf-8"), parse_constant=_no_constants)
    except UnicodeDecodeError:
        raise ReportError("the body is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"the body is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    errors = list(validator(SCHEMA).iter_errors(document))
    if errors:
        error = best_match(errors)
        where = pointer(list(error.absolute_path)) or "/"
        more = f" (and {len(errors) - 1} more problem{'s' * (len(errors) > 2)})" if len(errors) > 1 else ""
        message = error.message if len(error.message) <= 300 else error.message[:300] + "..."
        raise ReportError(f"{where}: {message}{more}")
    return BoxReport(box=box, received_at=received_at, peer=peer, revision=document["revision"],
                     installer_version=document["installer_version"], outcome=ReportOutcome(document["outcome"]),
                     body=freeze_mapping(document))


def staleness(report: BoxReport, served: dict[str, Any]) -> dict[str, Any]:
    """Compare what the box applied with what it is served now. Only boot-lifetime fields (the
    per-server digest) make a box stale: a new revision that changes nothing on it does not."""
    applied = report.server_digests()
    wanted = {s["name"]: s["digest"] for s in served.get("servers", []) if isinstance(s, dict)}
    servers = {name: ("current" if applied.get(name) == digest else "stale" if name in applied else "missing")
               for name, digest in wanted.items()}
    servers.update({name: "removed" for name in applied if name not in wanted})
    stale = report.outcome is not ReportOutcome.INSTALLED or any(v != "current" for v in servers.values())
    return {"stale": stale, "revision_matches": report.revision == served.get("revision"), "servers": servers}


def report_json(report: BoxReport) -> dict[str, Any]:
    return {"box": report.box, "received_at": report.received_at, "peer": report.peer, "revision": report.revision,
            "installer_version": report.installer_version, "outcome": report.outcome.value,
            "report": thaw(report.body)}
