"""Coverage-guided fuzzing (atheris, libFuzzer) of llmfleet's parsers of untrusted text.

    .venv/bin/python bench/fuzz_atheris.py TARGET [libFuzzer flags, e.g. -runs=100000 -max_total_time=600]

Targets, each fed raw bytes:
  yaml        llmfleet.core.fleet.strictyaml.load: problems only, never an exception
  validate    the bytes as placement.yaml beside the example's other files, through schema + semantic
              validation and, when valid, rendering and the installer's parse of every box JSON
  boxjson     llmfleet_installer.boxjson.parse_text: a BoxConfig or BoxJsonError
  secretref   llmfleet_contract.secretref.expand: a string or SecretRefError, the secret never in the message
  installer   the box JSON as Installer.run takes it: parse, fit check and card division on assumed
              GPUs, every Supervisor program; only BoxJsonError or UnitError (issue 16: OverflowError)
  flags       one argv token in a recipe's args: `llmfleet validate` and the installer's box-JSON check
              refuse it exactly when llmfleet_installer.vllmflags says vLLM could read it as a managed flag
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
    from llmfleet.core.fleet import strictyaml
    from llmfleet.core.fleet.bearer import Salt
    from llmfleet.core.fleet.files import FLEET_FILES, Snapshot
    from llmfleet.core.fleet.render import Bearers, render_all
    from llmfleet.core.fleet.validate import validate_snapshot
    from llmfleet_contract import secretref, vllmflags
    from llmfleet_installer.boxjson import BoxJsonError, parse_box, parse_text
    from llmfleet_installer.fit import check_fit
    from llmfleet_installer.main import assumed_gpus, render_units
    from llmfleet_installer.settings import load as load_settings
    from llmfleet_installer.units import UnitError

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


BOX_SETTINGS = load_settings({"LLMFLEET_DATA_DIR": "/srv/data", "LLMFLEET_SUPERVISOR_CONF_DIR": "/srv/conf"},
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


def fuzz_all(data: bytes) -> None:
    """Every target in one process (one start-up): the first byte picks it."""
    if data:
        ONE_BY_ONE[data[0] % len(ONE_BY_ONE)](data[1:])


ONE_BY_ONE = [fuzz_yaml, fuzz_validate, fuzz_boxjson, fuzz_secretref, fuzz_installer, fuzz_flags]  # seeds()' order
TARGETS = {"yaml": fuzz_yaml, "validate": fuzz_validate, "boxjson": fuzz_boxjson, "secretref": fuzz_secretref,
           "installer": fuzz_installer, "flags": fuzz_flags, "all": fuzz_all}


def seeds(target: str) -> list[bytes]:
    """A valid input or two per target, so that the fuzzer starts inside the format, not at JSON's door."""
    fleet = validate_snapshot(Snapshot("s" * 40, dict(EXAMPLE), {k: k for k in FLEET_FILES})).fleet
    assert fleet is not None
    box = json.dumps(render_all(fleet, BEARERS)["203.0.113.24"]).encode()
    by_target = {"yaml": list(EXAMPLE.values()), "validate": [EXAMPLE["placement.yaml"]], "boxjson": [box],
                 "secretref": [b"${env:A}", b"x-${env:B}-$${env:A}", b"${file:/nonexistent} ${cred:c}"],
                 "installer": [box], "flags": [b"api-ke=x", b"max_model", b"dtype", b"no-port", b"gpu-memory.x"]}
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
