"""Every spelling vLLM would read as a managed flag is refused: by `fleetllm validate` and by the installer.

vLLM's FlexibleArgumentParser turns `_` into `-` in an option's name (up to the first `.`), splits
`--flag=value` and `--flag.key`, and argparse's allow_abbrev takes any unambiguous prefix of a long option
(contract/fleetllm_contract/vllmflags.py). The rule refuses any prefix of a managed flag, so it can only be stricter than
vLLM; the property test below checks that against argparse itself, driven the way vLLM drives it. (A
test against the real vLLM parser lives with the vLLM harness.)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetllm_contract import vllmflags
from fleetllm_installer.boxjson import BoxJsonError, parse_box
from tests.fleet.helpers import MODELS, validate

# (token as written in args, the managed flag it becomes, or None)
TABLE = [
    ("--api-key", "api-key"),
    ("--api-ke=sk-secret", "api-key"),
    ("--api_ke", "api-key"),
    ("--API_KEY=x", "api-key"),
    ("--a", "api-key"),
    ("--api-key.x", "api-key"),
    ("--hos=0.0.0.0", "host"),
    ("--ho", "host"),
    ("--served-model", "served-model-name"),
    ("--served_model_name", "served-model-name"),
    ("--max-model", "max-model-len"),
    ("--max_model_len=4", "max-model-len"),
    ("--gpu-memory-util", "gpu-memory-utilization"),
    ("--gpu_memory", "gpu-memory-utilization"),
    ("--po", "port"),
    ("--port=8000", "port"),
    ("--u", "uds"),
    ("--no-port", "port"),
    ("--no-api-k", "api-key"),
    # not managed: other flags, short options, values, the end of options
    ("--dtype", None),
    ("--max-num-seqs", None),
    ("--max-model-len-x", None),
    ("--tensor-parallel-size", None),
    ("--enable-prefix-caching", None),
    ("--no-enable-prefix-caching", None),
    ("--port-x", None),
    ("-p", None),
    ("-tp", None),
    ("--", None),
    ("--=x", None),
    # --config FILE: vLLM reads flags from the file, which could set any managed flag (issue 27)
    ("--config", "config"),
    ("--config=/etc/vllm.yaml", "config"),
    ("--conf", "config"),
    ("--CONFIG", "config"),
    ("--config-format", None),
    ("api-key", None),
    ("8000", None),
]


@pytest.mark.parametrize(("token", "flag"), TABLE)
def test_the_rule(token: str, flag: str | None) -> None:
    assert vllmflags.managed_flag(token) == flag


@pytest.mark.parametrize(("token", "flag"), [(t, f) for t, f in TABLE if f is not None])
def test_validate_refuses_it_in_args_naming_file_line_spelling_and_flag(token: str, flag: str) -> None:
    models = MODELS.replace("{model: org/m2,", f"{{args: ['--dtype', 'half', {json.dumps(token)}], model: org/m2,")
    found = [d for d in validate(models=models).diagnostics if d.rule == "managed-flag"]
    assert len(found) == 1, [d.text() for d in found]
    d = found[0]
    assert (d.file, d.line, d.pointer) == ("models.yaml", 5, "/models/m2/vllm/args")
    assert d.message.startswith(f"args[2]: {token.split('=')[0]} ") and f"--{flag}" in d.message
    assert "remove it" in d.message and "sk-secret" not in d.message


@pytest.mark.parametrize(("key", "flag"), [
    ("api_ke", "api-key"), ("hos", "host"), ("served-model", "served-model-name"), ("max-model", "max-model-len"),
    ("gpu-memory-util", "gpu-memory-utilization"), ("no-port", "port"), ("Po", "port"),
])
def test_validate_refuses_it_as_a_settings_key(key: str, flag: str) -> None:
    models = MODELS.replace("{model: org/m2,", f"{{settings: {{dtype: half, {key}: '1'}}, model: org/m2,")
    found = [d for d in validate(models=models).diagnostics if d.rule == "managed-flag"]
    assert len(found) == 1, [d.text() for d in found]
    assert found[0].pointer == f"/models/m2/vllm/settings/{key}" and found[0].line == 5
    assert f"--{flag}" in found[0].message and f"settings key {key!r}" in found[0].message


def test_a_value_that_is_a_managed_flag_is_refused_too() -> None:
    models = MODELS.replace("{model: org/m2,", "{settings: {lora-modules: [a, --hos, b]}, model: org/m2,")
    found = [d for d in validate(models=models).diagnostics if d.rule == "managed-flag"]
    assert len(found) == 1 and "--host" in found[0].message


BOX = {"host": "h", "revision": "r", "servers": [{"name": "m", "model": "org/m", "port": 8001,
                                                   "api_key": "sk-vllm-abcdefgh", "args": []}]}


@pytest.mark.parametrize(("token", "flag"), [(t, f) for t, f in TABLE if f is not None])
def test_the_installer_refuses_it(token: str, flag: str) -> None:
    document: dict[str, Any] = copy.deepcopy(BOX)
    document["servers"][0]["args"] = ["--dtype", "half", token]
    with pytest.raises(BoxJsonError) as caught:
        parse_box(document, "h")
    (problem,) = caught.value.problems
    assert problem.startswith(f"servers[0].args[2]: {token.split('=')[0]} ") and f"--{flag}" in problem
    assert "sk-secret" not in problem


# --- the rule against argparse, driven the way vLLM drives it -------------------------------------

# Some of vLLM's own long options beside the managed ones, so that prefixes can be ambiguous as in vLLM.
OTHERS = ["dtype", "max-num-seqs", "max-num-batched-tokens", "max-logprobs", "model", "hf-overrides",
          "ssl-keyfile", "uvicorn-log-level", "api-server-count", "enable-prefix-caching", "tensor-parallel-size",
          "quantization", "disable-log-stats", "pipeline-parallel-size", "seed", "swap-space"]


def vllm_like_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=True, exit_on_error=False)
    for flag in (*vllmflags.MANAGED_FLAGS, *OTHERS):
        parser.add_argument(f"--{flag}", dest=flag.replace("-", "_"))
        parser.add_argument(f"--no-{flag}", dest=f"no_{flag.replace('-', '_')}", action="store_true")
    return parser


def vllm_normalise(token: str) -> str:
    """FlexibleArgumentParser's renaming: `_` -> `-` in the key up to the first `.`; `--a.b` keeps `--a`."""
    if not token.startswith("--"):
        return token
    key, eq, value = token.partition("=")
    key = re.sub(r"(?<=--)[^\.]*", lambda m: m.group(0).replace("_", "-"), key, count=1)
    key = key.split(".", 1)[0] if "." in key else key
    return key + eq + value


def argparse_reads_managed(token: str) -> bool:
    parser = vllm_like_parser()
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # argparse prints its usage before raising
            namespace, _ = parser.parse_known_args([vllm_normalise(token), "v"])
    except (argparse.ArgumentError, SystemExit):
        return False  # ambiguous or malformed: vLLM would refuse to start
    managed = {f.replace("-", "_") for f in vllmflags.MANAGED_FLAGS}
    return any(getattr(namespace, dest) is not None for dest in managed) or any(
        getattr(namespace, f"no_{dest}") for dest in managed)


def mixed_case_and_dashes(draw: st.DrawFn, name: str) -> str:
    return "".join(draw(st.sampled_from(["-", "_"])) if c == "-" else
                   (c.upper() if draw(st.booleans()) else c) for c in name)


@st.composite
def spellings(draw: st.DrawFn) -> str:
    flag = draw(st.sampled_from([*vllmflags.MANAGED_FLAGS, *OTHERS]))
    name = flag[:draw(st.integers(1, len(flag)))] if draw(st.booleans()) else flag
    if draw(st.booleans()):
        name = "no-" + name
    if draw(st.booleans()):
        name = mixed_case_and_dashes(draw, name)
    suffix = draw(st.sampled_from(["", "=x", "=--port", ".key", ".a_b=1", "x", "-x"]))
    return "--" + name + suffix


@settings(max_examples=400, deadline=None)
@given(spellings() | st.text(alphabet="-_=.aAdeghiklmnoprstuvxyz", max_size=14))
def test_whatever_argparse_reads_as_a_managed_flag_is_refused(token: str) -> None:
    if argparse_reads_managed(token):
        assert vllmflags.managed_flag(token) is not None, token


@settings(max_examples=300, deadline=None)
@given(spellings())
def test_refused_in_validation_exactly_when_refused_on_the_box(token: str) -> None:
    models = MODELS.replace("{model: org/m2,", f"{{args: [{json.dumps(token)}], model: org/m2,")
    in_validation = any(d.rule == "managed-flag" for d in validate(models=models).diagnostics)
    document: dict[str, Any] = copy.deepcopy(BOX)
    document["servers"][0]["args"] = [token]
    try:
        parse_box(document, "h")
        on_the_box = False
    except BoxJsonError:
        on_the_box = True
    assert in_validation == on_the_box == (vllmflags.managed_flag(token) is not None)
