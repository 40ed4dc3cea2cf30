"""Managed flags against vLLM's real parser: every spelling that vLLM 0.32's `serve` parser reads as one of
the flags fleetllm sets itself (--port, --host, --uds, --served-model-name, --max-model-len,
--gpu-memory-utilization, --api-key) must be refused by our rule, `managed_flags_in` in
reconciler/fleetllm/core/fleet/flags.py (which `fleetllm validate` applies to a recipe's args and rendered settings).

vLLM's parser accepts unambiguous prefixes of long options (`--api-ke`), `_` for `-` (`--max_model_len`)
and `--flag=value`. The spellings are generated from the parser's own option strings (every prefix, every
`_`/`-` mix, with a separate value and with `=value`, and the single-dash forms); the harness's Python asks
the parser what each one sets (tests/realvllm/vllm_parser_probe.py), and each one that sets a managed
flag's dest must make `managed_flags_in(tokens)` non-empty. The converse is checked too: the full spelling
of every unmanaged option passes, so the rule cannot pass by refusing everything.

Needs only the harness's venv (nothing is served): seconds, not minutes.
"""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fleetllm.core.fleet.flags import MANAGED_FLAGS, managed_flags_in, render_settings
from fleetllm_contract import vllmflags
from tests.realvllm.harness import Harness

PROBE = Path(__file__).resolve().parent / "vllm_parser_probe.py"
VALUES = {"port": "18123", "host": "127.0.0.9", "uds": "/tmp/probe.sock", "served-model-name": "probe-name",
          "max-model-len": "77", "gpu-memory-utilization": "0.33", "device-memory-utilization": "0.33",
          "api-key": "sk-probe-key"}


def managed_dests(options: dict[str, list[str]]) -> set[str]:
    """The parser's dests that a managed flag sets (--device-memory-utilization is another option string
    of gpu_memory_utilization's)."""
    return {dest for dest, strings in options.items() if any(s[2:] in MANAGED_FLAGS for s in strings)}


def dest_of(flag: str, options: dict[str, list[str]]) -> str | None:
    return next((dest for dest, strings in options.items() if f"--{flag}" in strings), None)

pytestmark = [pytest.mark.realvllm]


def probe(harness: Harness, mode: str, cases: Any = None) -> Any:
    done = subprocess.run([str(harness.python), str(PROBE), mode], input=json.dumps(cases), capture_output=True,
                          text=True, timeout=300, check=False, env={"PATH": "/usr/bin:/bin", **harness.box_env()})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def underscore_variants(name: str) -> list[str]:
    """Every mix of `-` and `_` at the name's dashes."""
    parts = name.split("-")
    return ["".join(p + s for p, s in itertools.zip_longest(parts, seps, fillvalue=""))
            for seps in itertools.product("-_", repeat=len(parts) - 1)]


def spellings(option: str) -> list[str]:
    """`--api-key` -> --a, --ap, ..., --api-key, each with every `_` mix, and -a ... -api-key."""
    name = option.lstrip("-")
    found = []
    for end in range(1, len(name) + 1):
        for variant in underscore_variants(name[:end].rstrip("-_") or name[:end]):
            found += [f"--{variant}", f"-{variant}"]
    return sorted(set(found))


def cases_for(options: dict[str, list[str]]) -> list[tuple[str, list[str]]]:
    """(managed flag, tokens) for every generated spelling of every managed option, both value forms."""
    cases = []
    for flag in sorted(MANAGED_FLAGS):
        dest = dest_of(flag, options)
        value = VALUES[flag]
        for option in options.get(dest, [f"--{flag}"]) if dest else [f"--{flag}"]:
            for spelled in spellings(option):
                cases += [(flag, [spelled, value]), (flag, [f"{spelled}={value}"])]
    return cases


@pytest.fixture(scope="module")
def options(harness: Harness) -> dict[str, list[str]]:
    """Every `serve` option's strings, by dest, from the real parser (one vLLM import for the module)."""
    found: dict[str, list[str]] = probe(harness, "options")
    return found


def test_every_spelling_vllm_reads_as_a_managed_flag_is_refused(harness: Harness,
                                                                 options: dict[str, list[str]]) -> None:
    assert all(dest_of(flag, options) for flag in MANAGED_FLAGS), "vLLM renamed a managed flag"
    cases = cases_for(options)
    results = probe(harness, "parse", [tokens for _, tokens in cases])
    managed = managed_dests(options)
    read_as_managed = [(tokens, sorted(set(result["set"]) & managed))
                       for (_, tokens), result in zip(cases, results, strict=True)
                       if "set" in result and set(result["set"]) & managed]
    assert len(read_as_managed) > 100  # the generator really produced what vLLM accepts
    # Sanity of the probe itself: the abbreviations the issue names are read as managed flags by vLLM.
    accepted = {tokens[0].split("=", 1)[0] for tokens, _ in read_as_managed}
    assert {"--api-ke", "--hos", "--served-model", "--max-model", "--gpu-memory-util", "--max_model_len"} <= accepted
    missed = [f"{' '.join(tokens)} (vLLM sets {', '.join(dests)})" for tokens, dests in read_as_managed
              if not managed_flags_in(tokens)]
    assert not missed, f"{len(missed)} spelling(s) vLLM reads as a managed flag pass our rule: {missed[:20]}"
    # The same spellings reach the command line through a recipe's `settings` (rendered as --KEY VALUE).
    for tokens, _ in read_as_managed:
        key = tokens[0].lstrip("-").split("=", 1)[0]
        if tokens[0].startswith("--") and "=" not in tokens[0]:
            assert managed_flags_in(render_settings({key: tokens[1]})), f"settings: {{{key}: ...}} passes"


def test_unmanaged_options_pass_our_rule(options: dict[str, list[str]]) -> None:
    """The converse: the full spelling of every option vLLM's serve parser has that is not managed passes,
    but for the file flags refused on purpose (`--config FILE` could set any managed flag)."""
    managed = managed_dests(options)
    refused = [option for dest, strings in options.items() if dest not in managed
               for option in strings if option.startswith("--") and option[2:] not in vllmflags.FILE_FLAGS
               and managed_flags_in([option, "1"])]
    assert not refused, f"our rule refuses options vLLM does not read as managed: {refused}"
    assert len(options) > 100  # the real parser, not a stub of it


def test_every_command_line_the_installer_writes_parses(harness: Harness, tmp_path: Path) -> None:
    """The example fleet's boxes rendered through the real installer path (box JSON -> fit -> Supervisor
    program; tests/installer/test_real_vllm_cli.py's rendering, which needs vLLM in the project's venv),
    each `vllm serve` argv taken back out of its program as Supervisor splits it, parsed by vLLM 0.32's
    own parser: no line is refused, each sets what the installer meant, and none carries the bearer."""
    from tests.support.rendered_argv import rendered_argvs

    argvs = rendered_argvs(tmp_path)
    assert len(argvs) == 7
    results = probe(harness, "argv", [argv[1:] for argv in argvs])
    for argv, result in zip(argvs, results, strict=True):
        assert "set" in result, f"vLLM refuses {' '.join(argv)}: {result['error']}"
        got = result["set"]
        assert (got["subparser"], got["model_tag"]) == ("serve", argv[2])
        assert got["port"] == int(argv[argv.index("--port") + 1])
        assert got["host"] == argv[argv.index("--host") + 1]
        assert got["served_model_name"] == [argv[argv.index("--served-model-name") + 1]]
        assert got["max_model_len"] == int(argv[argv.index("--max-model-len") + 1])
        if "--gpu-memory-utilization" in argv:
            assert got["gpu_memory_utilization"] == float(argv[argv.index("--gpu-memory-utilization") + 1])
        assert got["api_key"] is None  # the bearer comes from VLLM_API_KEY, never the command line
