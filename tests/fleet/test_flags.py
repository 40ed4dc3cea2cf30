"""Settings rendering (LLMhop's vLLM rules) and managed flags."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetllm.core.fleet.flags import MANAGED_FLAGS, flag_name, managed_flags_in, render_settings, split_args
from fleetllm.core.fleet.jsonvalue import JSON, freeze, freeze_mapping
from fleetllm_contract import vllmflags


def test_llmhop_worked_example() -> None:
    # ../shared/reference/llmhop.md §10, LLMhop's own test case for vLLM.
    settings = {"temperature": 0.6, "max-model-len": 8192, "enable-prefix-caching": False,
                "lora-paths": ["x=/p/x", "y=/p/y"], "empty": [], "dropped": None,
                "speculative-config": {"model": "d", "num_speculative_tokens": 3}}
    assert list(render_settings(freeze_mapping(settings))) == [
        "--lora-paths", "x=/p/x", "y=/p/y", "--max-model-len", "8192",
        "--no-enable-prefix-caching",
        "--speculative-config", '{"model":"d","num_speculative_tokens":3}',
        "--temperature", "0.6"]


def test_true_false_and_negated_keys() -> None:
    assert render_settings(freeze_mapping({"a": True, "b": False, "no-c": False})) == ("--a", "--c", "--no-b")


def test_strings_are_verbatim_and_numbers_json() -> None:
    assert render_settings(freeze_mapping({"p": "a b $x", "n": 10, "f": 1e-05})) == (
        "--f", "1e-05", "--n", "10", "--p", "a b $x")


def test_non_ascii_stays_readable_and_nan_is_refused() -> None:
    """Numbers and mappings render as strict JSON: non-ASCII text as itself (not \\u escapes), and never
    NaN, which is not JSON (strictyaml never reads one: render_settings refuses it rather than emit it)."""
    assert render_settings(freeze_mapping({"chat-template-kwargs": {"greeting": "h\u00e9 \u4f60\u597d"}})) == (
        "--chat-template-kwargs", '{"greeting":"h\u00e9 \u4f60\u597d"}')
    assert render_settings(freeze_mapping({"stop": ["\u00e9", 1.5]})) == ("--stop", "\u00e9", "1.5")
    for value in (float("nan"), [float("inf")]):
        with pytest.raises(ValueError, match="JSON compliant"):
            render_settings(freeze_mapping({"temperature": value}))  # type: ignore[dict-item]


def test_flag_name_normalises_a_long_flag() -> None:
    assert flag_name("--Max_Model_Len=4") == "max-model-len"
    assert flag_name("--no-enable-prefix-caching") == "no-enable-prefix-caching"


def test_split_args() -> None:
    assert split_args("--a 'b c' --d") == ("--a", "b c", "--d")
    assert split_args(["--a", "b c"]) == ("--a", "b c")


def test_managed_flags_are_found_in_every_spelling() -> None:
    argv = ["--port", "1", "--Max_Model_Len=4", "--no-api-key", "--served-model-name", "x", "--dtype", "half",
            "--host=0.0.0.0", "--uds", "/s"]
    assert managed_flags_in(argv) == ["--port", "--Max_Model_Len", "--no-api-key", "--served-model-name",
                                      "--host", "--uds"]
    assert managed_flags_in(["--dtype", "bfloat16", "-p", "--"]) == []


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                      st.text(max_size=8).filter(lambda t: not t.startswith("-")))
json_values = st.one_of(json_leaf, st.lists(json_leaf, max_size=3),
                        st.dictionaries(st.text(max_size=4), json_leaf, max_size=3))
keys = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,20}", fullmatch=True)


def _managed_key(key: str) -> bool:
    name = key.replace("_", "-").lower()
    return any(flag.startswith(candidate) for flag in (*MANAGED_FLAGS, *vllmflags.FILE_FLAGS)
               for candidate in (name, name.removeprefix("no-")) if candidate)


def _expected_length(settings: dict[str, JSON]) -> int:
    total = 0
    for value in settings.values():
        if value is None or value == []:
            continue
        total += 1 + (len(value) if isinstance(value, list) else 0 if isinstance(value, bool) else 1)
    return total


@given(st.dictionaries(keys, json_values, max_size=6))
def test_rendering_is_deterministic_and_complete(settings: dict[str, JSON]) -> None:
    argv = render_settings(freeze_mapping(settings))
    assert argv == render_settings(freeze_mapping(dict(reversed(list(settings.items())))))
    assert len(argv) == _expected_length(settings)


@given(st.dictionaries(keys.filter(lambda k: not _managed_key(k)), json_values, max_size=6))
def test_settings_without_managed_keys_never_render_a_managed_flag(settings: dict[str, JSON]) -> None:
    assert managed_flags_in(render_settings(freeze_mapping(settings))) == []


@given(st.sampled_from(sorted(MANAGED_FLAGS)), st.sampled_from(["{}", "{}_x", "no-{}"]), json_leaf)
def test_a_managed_key_in_any_spelling_is_caught(flag: str, spelling: str, value: JSON) -> None:
    key = spelling.format(flag.replace("-", "_")) if "_x" in spelling else spelling.format(flag)
    key = key.removesuffix("_x")
    rendered = render_settings(freeze_mapping({key: value}))
    assert managed_flags_in(rendered) == ([] if value is None else [rendered[0]])


def test_freeze_is_deep() -> None:
    frozen = freeze({"a": [1, {"b": 2}]})
    assert frozen["a"][1]["b"] == 2  # type: ignore[index,call-overload]
    assert isinstance(frozen["a"], tuple)  # type: ignore[index,call-overload]
