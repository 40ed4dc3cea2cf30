"""The box-facing endpoints (the box contract): GET /vllm/config, POST /vllm/report, GET /vllm/installer,
GET /vllm/gateway-native/<tag>.

All four require the fleet key (`requires(Role.FLEET)`: 503 when none is configured, 403 when missing
or wrong) and every request, answered or refused, becomes one fetch record and one JSON log line (no
secret in either): `box_request()` is opened before the view and `finish` records the answer.

Under `fleetllm serve`, GET /vllm/config is mostly answered on the event loop instead (boxloop.py),
through the same functions (boxcontract.py, auth.fleet_key_refusal); what that path cannot answer
from memory comes here, as does everything under a test client.
"""

from __future__ import annotations

import hmac
from typing import cast

from flask import Blueprint, Response, g, jsonify, request
from werkzeug.exceptions import ClientDisconnected, RequestEntityTooLarge

from fleetllm.adapters.state.records import BoxApi, Sighting
from fleetllm.core.rollout.retire import RetireState
from fleetllm.logs import log_event
from fleetllm.server.access import Refused, requires
from fleetllm.server.auth import Role
from fleetllm.server.boxcontract import NO_REVISION, BoxCall, access_log, config_answer
from fleetllm.server.errors import NO_STORE, error
from fleetllm.server.reports import MAX_REPORT_BYTES, ReportError, parse_report
from fleetllm.server.revisions import Rendered, RenderedBox, rendered_box
from fleetllm.server.rollouts import Leaving, leaving
from fleetllm.server.runtime import Runtime, current_runtime
from fleetllm_contract.gatewaynative import MAX_TAG, MEDIA_TYPE, PATH_PREFIX, SHA256_HEADER, is_tag

bp = Blueprint("box", __name__)
ENDPOINTS = {"box.vllm_config": BoxApi.CONFIG, "box.vllm_report": BoxApi.REPORT,
             "box.vllm_installer": BoxApi.INSTALLER, "box.vllm_gateway_native": BoxApi.GATEWAY_NATIVE}


class BoxRequest(BoxCall):
    """One box request on the Flask path (boxcontract.BoxCall, read from Flask's request)."""

    def __init__(self, rt: Runtime, endpoint: BoxApi) -> None:
        super().__init__(rt, endpoint, request.headers.get("X-LLMAO-Host"),
                         ", ".join(request.headers.getlist("X-Forwarded-For")) or None, request.remote_addr or "")

    def known_box(self) -> tuple[Rendered, str, Leaving | None] | Response:
        """Box resolution and placement lookup shared by config and report (after the key check): the
        served revision, the box name and, for a box that left the placement, how it leaves; or the
        (already finished) refusal: an unknown box's, or a retired box's 404."""
        name = self.resolve()
        served = self.rt.tracker.served
        if served is None:
            return self.finish(error(503, NO_REVISION))
        if name in served.fleet.boxes:
            return served, name, None
        gone = leaving(self.rt, name)
        if gone is None:
            return self.finish(self.unknown_box(served, name))
        if gone.state is RetireState.RETIRED:
            return self.finish(error(404, f"box {name!r} was retired: it left the placement at revision "
                                          f"{gone.revision[:12]}; a box that comes back is approved as a new box"))
        return served, name, gone

    def unknown_box(self, served: Rendered, name: str) -> Response:
        evicted = self.rt.store.note_unknown(Sighting(name, self.rt.clock(), self.peer, self.claimed,
                                                      self.forwarded_for), self.rt.config.attention_max_entries)
        self.rt.metrics.attention_entries.set(self.rt.store.attention_size())
        if evicted:
            self.rt.metrics.attention_evicted.inc(evicted)
        return error(404, f"box {name!r} is not in the placement at revision {served.revision}; an admin can "
                          "approve it")

    def finish(self, response: Response, revision: str | None = None) -> Response:
        self.record(response.status_code, revision)
        response.headers["Cache-Control"] = NO_STORE
        if revision is not None:
            response.headers["X-Fleet-Revision"] = revision
        return response


def read_report_body() -> bytes:
    """The request body; ReportError 413 when it is larger than MAX_REPORT_BYTES, declared or
    chunked, 400 when the client stops sending before its end.

    Read here rather than with `request.max_content_length` + `get_data()`: a chunked body past the
    limit came back cut to the limit instead of raising, and was then refused as bad JSON (or worse,
    accepted) instead of getting its 413."""
    too_large = ReportError(f"the report is larger than {MAX_REPORT_BYTES // 1024} KiB", status=413)
    if request.content_length is not None and request.content_length > MAX_REPORT_BYTES:
        raise too_large
    stream = request.stream
    parts: list[bytes] = []
    size = 0
    try:
        while size <= MAX_REPORT_BYTES:
            part = stream.read(MAX_REPORT_BYTES + 1 - size)
            if not part:
                break
            parts.append(part)
            size += len(part)
    except RequestEntityTooLarge:
        raise too_large from None
    except ClientDisconnected:
        raise ReportError("the body ended before its Content-Length") from None
    if size > MAX_REPORT_BYTES:
        raise too_large
    return b"".join(parts)


@bp.before_request
def open_box_request() -> None:
    g.fleetllm_box = BoxRequest(current_runtime(), ENDPOINTS[str(request.endpoint)])


def box_request() -> BoxRequest:
    """The current box request (opened before the view and its key check)."""
    return cast(BoxRequest, g.fleetllm_box)


@bp.errorhandler(Refused)
def refused(exc: Refused) -> Response:
    """The box contract's refusals (503 no fleet key configured, 403 missing or wrong), recorded."""
    return box_request().finish(error(exc.code or 403, exc.description or exc.name))


@bp.get("/vllm/config")
@requires(Role.FLEET)
def vllm_config() -> Response:
    box = box_request()
    known = box.known_box()
    if isinstance(known, Response):
        return known
    served, name, gone = known
    if gone is not None:
        return leaving_config(box, gone)
    answer = config_answer(box.rt, served, name, request.headers.get("If-None-Match"))
    assert answer is not None  # waiting allowed: always an answer
    if answer.error is not None:
        return box.finish(error(answer.status, answer.error), answer.revision)
    response = Response(status=304) if answer.body is None else Response(answer.body, mimetype="application/json")
    response.headers["ETag"] = str(answer.etag)
    return box.finish(response, answer.revision)


def config_response(rendered: RenderedBox) -> Response:
    """200 with the box JSON, or 304 when the box holds it (If-None-Match); with its ETag."""
    if request.if_none_match.contains_weak(rendered.etag.strip('"')):
        response = Response(status=304)
    else:
        response = Response(rendered.body, mimetype="application/json")
    response.headers["ETag"] = rendered.etag
    return response


def leaving_config(box: BoxRequest, gone: Leaving) -> Response:
    """GET /vllm/config of a box that left the placement: while it drains, what it runs; while it retires,
    a box JSON with no servers (its programs are removed); a retired box had its 404 in known_box."""
    if gone.state is RetireState.RETIRING:
        report_key = current_runtime().tracker.bearers.salt.report_key(gone.box)
        return box.finish(config_response(rendered_box(gone.document(report_key))), gone.revision)
    if gone.kept is not None and gone.box in gone.kept.boxes:
        return box.finish(config_response(gone.kept.boxes[gone.box]), gone.kept.revision)
    return box.finish(error(503, f"box {gone.box!r} left the placement: its deployments leave LiteLLM before it is "
                                 "told to stop its servers; it keeps its current config meanwhile"))


@bp.post("/vllm/report")
@requires(Role.FLEET)
def vllm_report() -> Response:
    rt = current_runtime()
    box = box_request()
    known = box.known_box()
    if isinstance(known, Response):
        return known
    served, name, _ = known  # a box that left the placement reports too: its empty box is how it retires
    refused_key = check_report_key(rt, name)
    if refused_key is not None:
        refused_key.headers["Connection"] = "close"  # the body is left unread
        return box.finish(refused_key)
    try:
        body = read_report_body()
    except ReportError as exc:
        refused = error(exc.status, str(exc))
        refused.headers["Connection"] = "close"  # the rest of the body is left unread
        return box.finish(refused)
    try:
        report = parse_report(body, name, box.peer, rt.clock())
    except ReportError as exc:
        return box.finish(error(400, f"bad report: {exc}"))
    rt.store.record_report(report, keep=rt.config.state.reports_per_box)
    rt.metrics.box_reports.labels(report.outcome.value).inc()
    log_event(access_log, "box report", box=name, outcome=report.outcome.value, revision=report.revision,
              served_revision=served.revision, installer_version=report.installer_version)
    return box.finish(jsonify({"status": "recorded"}), served.revision)


REPORT_KEY_HEADER = "X-Fleetllm-Report-Key"


def check_report_key(rt: Runtime, name: str) -> Response | None:
    """The per-box report key (the box JSON's `report_key`, HMAC of the box name under the salt), on top of
    the fleet key: a leaked fleet key cannot report for another box. A wrong key is always a 403; a
    missing one is a 403 unless server.report_key_required is false (boxes whose box program predates
    the key: docs/security.md, "A leaked fleet key")."""
    given = request.headers.get(REPORT_KEY_HEADER)
    if given is None:
        if not rt.config.report_key_required:
            return None
        return error(403, f"POST /vllm/report for box {name!r} needs its {REPORT_KEY_HEADER} (the box JSON's "
                          "report_key): this box's installer predates per-box report keys; re-run it (it fetches "
                          "the current box program), or set server.report_key_required: false while old boxes "
                          "are replaced")
    salts = [rt.tracker.bearers.salt, rt.tracker.bearers.previous_salt]
    if any(salt is not None and hmac.compare_digest(given.encode(), salt.report_key(name).encode())
           for salt in salts):
        return None
    return error(403, f"{REPORT_KEY_HEADER} is not box {name!r}'s report key: a box reports only for itself "
                      "(re-fetch the box JSON if the salt was rotated)")


@bp.get("/vllm/installer")
@requires(Role.FLEET)
def vllm_installer() -> Response:
    box = box_request()
    box.resolve()
    installer = current_runtime().installer
    if request.if_none_match.contains_weak(installer.sha256):
        response = Response(status=304)
    else:
        response = Response(installer.body, mimetype="application/octet-stream")
        response.headers["Content-Disposition"] = "attachment; filename=fleetllm-box.pyz"
    response.headers["ETag"] = installer.etag
    response.headers["X-Installer-Sha256"] = installer.sha256
    return box.finish(response)


@bp.get(f"{PATH_PREFIX}<tag>")
@requires(Role.FLEET)
def vllm_gateway_native(tag: str) -> Response:
    """The gateway's compiled build for the Python of the box's gateway, named by its tag
    (fleetllm_contract.gatewaynative): 200 with the archive, 304 when the box holds it, 404 when this
    control plane has none for the tag (the box then runs the gateway's Python modules)."""
    box = box_request()
    box.resolve()
    builds = current_runtime().gateway_builds
    if not is_tag(tag):
        shown = tag[:MAX_TAG] + ("..." if len(tag) > MAX_TAG else "")  # what a client sent: quoted, capped
        return box.finish(error(404, f"{shown!r} is not a gateway build tag (the extension suffix of the Python "
                                     "that runs the gateway without its dot and .so, such as "
                                     "cpython-311-x86_64-linux-gnu): ask for that tag; without a build the box "
                                     "runs the gateway's Python modules"))
    build = builds.get(tag)
    if build is None:
        return box.finish(error(404, f"this control plane has no compiled gateway for {tag} (it has "
                                     f"{', '.join(builds.tags) or 'none'}): the box runs the gateway's Python "
                                     "modules; to compile it, add a build made for that Python with "
                                     "tools/build_gateway_native.py to the control plane's server.gateway_native"))
    if request.if_none_match.contains_weak(build.sha256):
        response = Response(status=304)
    else:
        response = Response(build.body, mimetype=MEDIA_TYPE)
        response.headers["Content-Disposition"] = f"attachment; filename=fleetllm-gateway-native-{tag}.tar.gz"
    response.headers["ETag"] = build.etag
    response.headers[SHA256_HEADER] = build.sha256
    return box.finish(response)
