"""Coverage-guided fuzzing (atheris, libFuzzer) of fleetllm's parsers of untrusted text.

    .venv/bin/python bench/fuzz_atheris.py TARGET [libFuzzer flags, e.g. -runs=100000 -max_total_time=600]

Targets, each fed raw bytes:
  yaml        fleetllm.core.fleet.strictyaml.load: problems only, never an exception
  validate    the bytes as placement.yaml beside the example's other files, through schema + semantic
              validation and, when valid, rendering and the installer's parse of every box JSON
  boxjson     fleetllm_installer.boxjson.parse_text: a BoxConfig or BoxJsonError
  secretref   fleetllm_contract.secretref.expand: a string or SecretRefError, the secret never in the message
  installer   the box JSON as Installer.run takes it: parse, fit check and card division on assumed
              GPUs, every Supervisor program; only BoxJsonError or UnitError (issue 16: OverflowError)
  flags       one argv token in a recipe's args: `fleetllm validate` and the installer's box-JSON check
              refuse it exactly when fleetllm_contract.vllmflags says vLLM could read it as a managed flag
  gatewaybody fleetllm_gateway.jsonscan: the scanner finds the same model (or error) as json.loads, also with
              windows of a few bytes, and never raises anything but BodyError
  report      fleetllm.server.reports.parse_report: a BoxReport or ReportError (400/413), never
              another exception (a RecursionError or a ValueError used to be a 500)
  all         the six above in one process, the first byte picking one (what CI runs, briefly)

Without a corpus directory argument, ./fuzz-corpus-TARGET is used (created and seeded with valid inputs;
it keeps what the fuzzer finds, so a later run goes on from there). Any other exception is a crash:
libFuzzer stops, prints the input and writes it to crash-<sha1>.
tests/faults/test_fuzz.py runs `all` for a few seconds in CI; run longer by hand
(docs/reliability.md lists the runs made).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import atheris

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

with atheris.instrument_imports():
    import fleetllm_gateway.jsonscan as jsonscan
    from fleetllm.core.fleet import strictyaml
    from fleetllm.core.fleet.bearer import Salt
    from fleetllm.core.fleet.files import FLEET_FILES, Snapshot
    from fleetllm.core.fleet.render import Bearers, render_all
    from fleetllm.core.fleet.validate import validate_snapshot
    from fleetllm.server.reports import ReportError, parse_report
    from fleetllm_contract import secretref, vllmflags
    from fleetllm_gateway.errors import BodyError
    from fleetllm_installer.boxjson import BoxJsonError, parse_box, parse_text
    from fleetllm_installer.fit import check_fit
    from fleetllm_installer.main import assumed_gpus, render_units
    from fleetllm_installer.settings import load as load_settings
    from fleetllm_installer.units import UnitError

EXAMPLE = {name: (ROOT / "fleet-repo-example" / name).read_bytes() for name in FLEET_FILES}
BEARERS = Bearers(Salt("atheris-salt-0123456789abcdef"), "sk-atheris-legacy")
SECRET = "atheris-secret-value-0001"


def fuzz_yaml(data: bytes) -> None:
    doc = strictyaml.load(data, "f.yaml")
    if doc.root is not None:
        json.dumps(doc.value)


def fuzz_validate(data: bytes) -> None:
    files = {**EXAMPLE, "placement.yaml": data}
    result = validate_snapshot(Snapshot("f" * 40, files, {k: k for k in FLEET_FILES}))
    if result.fleet is None:
        assert result.errors
        return
    for host, document in render_all(result.fleet, BEARERS).items():
        parse_box(json.loads(json.dumps(document)), host)


def fuzz_boxjson(data: bytes) -> None:
    try:
        parse_text(data.decode("utf-8", "replace"), "203.0.113.24")
    except BoxJsonError as exc:
        if not exc.problems:
            raise AssertionError("BoxJsonError without a problem") from exc


def fuzz_secretref(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    if SECRET in text:
        return
    try:
        secretref.expand(text, {"A": SECRET, "B": ""})
    except secretref.SecretRefError as exc:
        if SECRET in str(exc):
            raise AssertionError(f"the secret is in the error: {exc}") from exc


BOX_SETTINGS = load_settings({"FLEETLLM_DATA_DIR": "/srv/data", "FLEETLLM_SUPERVISOR_CONF_DIR": "/srv/conf"},
                             need_control_plane=False)
GPUS = assumed_gpus("2x80")


def fuzz_installer(data: bytes) -> None:
    try:
        box = parse_text(data.decode("utf-8", "replace"), "203.0.113.24")
    except BoxJsonError:
        return
    fit = check_fit(box.servers, GPUS, 500.0)
    with contextlib.suppress(UnitError):  # refused with its reason, and reported
        render_units(box, fit, BOX_SETTINGS)


FLAGS_MODELS = b"models:\n  m:\n    vllm:\n      model: org/m\n      args: %s\n"
FLAGS_BOX = {"host": "h", "servers": [{"name": "m", "model": "org/m", "port": 8001, "api_key": "sk-vllm-abcdefgh"}]}


def fuzz_flags(data: bytes) -> None:
    token = "--" + data.decode("utf-8", "replace")
    if any(ord(c) < 32 or ord(c) == 127 or not c.isascii() for c in token):
        return  # refused as unsafe-arg on both sides, whatever the flag
    managed = vllmflags.managed_flag(token) is not None
    models = FLAGS_MODELS % json.dumps([token]).encode()
    files = {"fleet.yaml": b"listen_ports: [8001]\n", "models.yaml": models,
             "placement.yaml": b"hosts:\n  203.0.113.9:\n    - [m, 8001]\n"}
    result = validate_snapshot(Snapshot("f" * 40, files, {k: k for k in FLEET_FILES}))
    in_validation = any(d.rule == "managed-flag" for d in result.diagnostics)
    try:
        parse_box({**FLAGS_BOX, "servers": [{**FLAGS_BOX["servers"][0], "args": [token]}]}, "h")
        on_the_box = False
    except BoxJsonError:
        on_the_box = True
    if not in_validation == on_the_box == managed:
        raise AssertionError(f"{token!r}: validate {in_validation}, box {on_the_box}, rule {managed}")


def _model_or_error(find: object, body: bytes) -> str:
    try:
        return "model:" + find(body)  # type: ignore[operator]
    except BodyError as exc:
        return exc.error.code


def fuzz_gatewaybody(data: bytes) -> None:
    if not data:
        return
    window, body = data[0] % 8 + 1, data[1:]
    if body.count(b"[") + body.count(b"{") > 400:  # json.loads's recursion limit is not the reference
        return
    expected = _model_or_error(jsonscan.loads_model, body)
    got = _model_or_error(jsonscan.scan_model, body)
    saved = jsonscan.WINDOW, jsonscan.RUN_WINDOW
    jsonscan.WINDOW = jsonscan.RUN_WINDOW = window
    try:
        small_windows = _model_or_error(jsonscan.scan_model, body)
    finally:
        jsonscan.WINDOW, jsonscan.RUN_WINDOW = saved
    if not expected == got == small_windows:
        raise AssertionError(f"json.loads: {expected}, scanner: {got}, {window}-byte windows: {small_windows}")


def fuzz_report(data: bytes) -> None:
    try:
        parse_report(data, "203.0.113.24", "127.0.0.1", 0.0)
    except ReportError as exc:
        if exc.status not in (400, 413):
            raise AssertionError(f"status {exc.status}") from exc


def fuzz_all(data: bytes) -> None:
    """Every target in one process (one start-up): the first byte picks it."""
    if data:
        ONE_BY_ONE[data[0] % len(ONE_BY_ONE)](data[1:])


ONE_BY_ONE = [fuzz_yaml, fuzz_validate, fuzz_boxjson, fuzz_secretref, fuzz_installer, fuzz_flags, fuzz_gatewaybody,
              fuzz_report]  # seeds() order
TARGETS = {"yaml": fuzz_yaml, "validate": fuzz_validate, "boxjson": fuzz_boxjson, "secretref": fuzz_secretref,
           "installer": fuzz_installer, "flags": fuzz_flags, "gatewaybody": fuzz_gatewaybody, "report": fuzz_report,
           "all": fuzz_all}


def seeds(target: str) -> list[bytes]:
    """A valid input or two per target, so that the fuzzer starts inside the format, not at JSON's door."""
    fleet = validate_snapshot(Snapshot("s" * 40, dict(EXAMPLE), {k: k for k in FLEET_FILES})).fleet
    assert fleet is not None
    box = json.dumps(render_all(fleet, BEARERS)["203.0.113.24"]).encode()
    by_target = {"yaml": list(EXAMPLE.values()), "validate": [EXAMPLE["placement.yaml"]], "boxjson": [box],
                 "secretref": [b"${env:A}", b"x-${env:B}-$${env:A}", b"${file:/nonexistent} ${cred:c}"],
                 "installer": [box], "flags": [b"api-ke=x", b"max_model", b"dtype", b"no-port", b"gpu-memory.x"],
                 "gatewaybody": [b'\x03{"model": "m", "messages": [{"role": "user", "content": "a\\"\\u00e9"}], '
                                 b'"n": 1.5e3}',
                                 b'\x01{"x": [[], {}, [1, [true, null]]], "model": "m"}'],
                 "report": [json.dumps({"revision": "r", "installer_version": "0.1.0", "outcome": "installed",
                                        "fit": {"ok": True, "vram_needed_gb": 1.5}}).encode()]}
    if target == "all":
        return [bytes([i]) + seed for i, name in enumerate(by_target) for seed in by_target[name]]
    return by_target[target]


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(TARGETS)}}} [libFuzzer flags] [corpus dir]")
    name, flags = sys.argv[1], sys.argv[2:]
    if not any(not f.startswith("-") for f in flags):  # no corpus given: ./fuzz-corpus-NAME, seeded
        corpus = Path(f"fuzz-corpus-{name}")
        corpus.mkdir(exist_ok=True)
        for i, seed in enumerate(seeds(name)):
            (corpus / f"seed-{i}").write_bytes(seed)
        flags.append(str(corpus))
    atheris.Setup([sys.argv[0], *flags], TARGETS[name])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
