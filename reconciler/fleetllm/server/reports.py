"""Box reports (POST /vllm/report): parse and validate against schemas/box-report.schema.json."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from jsonschema.exceptions import best_match

from fleetllm.core.boxreport import BoxReport
from fleetllm.core.fleet.diagnostics import pointer
from fleetllm.core.fleet.jsonvalue import freeze_mapping, thaw
from fleetllm.core.fleet.schema import validator
from fleetllm.errors import RequestError
from fleetllm_contract.report import ReportOutcome

MAX_REPORT_BYTES = 64 * 1024
MAX_REPORT_DEPTH = 32  # a valid report nests 5 levels (report > fit > gpus > gpu > field)
MAX_NUMBER_CHARS = 40  # a valid report's numbers are MiB counts and GB figures
SCHEMA = "box-report"
# A string, or an unterminated one up to the end (so that no start is scanned twice: linear time).
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class ReportError(RequestError, ValueError):
    """The report is not acceptable; the message says where and why (sent back with `status`)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _no_constants(name: str) -> None:
    raise ReportError(f"{name} is not a JSON number")


def _number(literal: str) -> int | float:
    """A JSON number, refused when longer than any report needs: Python refuses to convert an
    integer of more than 4,300 digits (ValueError, a 500 before this check), and a float literal
    like 1e999 would become infinity, which the state store cannot write back as JSON."""
    if len(literal) > MAX_NUMBER_CHARS:
        raise ReportError(f"a number has {len(literal)} characters (at most {MAX_NUMBER_CHARS})")
    value = float(literal) if any(c in literal for c in ".eE") else int(literal)
    if isinstance(value, float) and not math.isfinite(value):
        raise ReportError(f"the number {literal} is out of range")
    return value


def nesting_depth(body: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (strings skipped; not a validation)."""
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for byte in brackets:
        if byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def parse_report(body: bytes, box: str, peer: str, received_at: float) -> BoxReport:
    """The report in `body` (at most MAX_REPORT_BYTES, which the endpoint enforces), or ReportError."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ReportError("the body is not UTF-8 text") from None
    depth = nesting_depth(body)
    if depth > MAX_REPORT_DEPTH:  # checked first: json and jsonschema recurse, and fail past ~1,000
        raise ReportError(f"the body nests {depth} levels deep (at most {MAX_REPORT_DEPTH})")
    try:
        document: Any = json.loads(text, parse_constant=_no_constants, parse_int=_number, parse_float=_number)
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
                     body=freeze_mapping(document), agent=document.get("agent", False) is True)


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
            "installer_version": report.installer_version, "outcome": report.outcome.value, "agent": report.agent,
            "report": thaw(report.body)}
