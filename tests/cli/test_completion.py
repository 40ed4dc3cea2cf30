"""`fleetllm completion bash|zsh|fish`: scripts generated from the real parser (shtab), run in the real
shells. bash: sourced in a plain non-interactive bash, `complete -p fleetllm` is defined, and its
function, called as bash calls it (COMP_WORDS, COMP_CWORD), completes every command and every option of
every command. fish: sourced, `complete -C LINE` lists what fish would offer. zsh: installed in $fpath
for compinit, TAB pressed in an interactive zsh on a pseudo-terminal (zsh/zpty), the matches read back."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest

from fleetllm.cli.completion import script
from fleetllm.cli.main import COMMANDS, build_parser
from tests.conftest import ROOT

HERE = Path(__file__).resolve().parent


def every_option() -> dict[str, list[str]]:
    parser = build_parser(full=True)
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: [s for a in sub._actions for s in a.option_strings] for name, sub in commands.choices.items()}


BASH_HARNESS = r"""
source "$1"
complete -p fleetllm || exit 3
fn=$(complete -p fleetllm | sed -E 's/.* -F ([^ ]+) .*/\1/')
while IFS= read -r line; do
  read -r -a COMP_WORDS <<< "$line"
  [[ $line == *" " ]] && COMP_WORDS+=("")
  COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); COMP_LINE=$line; COMP_POINT=${#line}; COMPREPLY=()
  "$fn" fleetllm "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
  echo "${COMPREPLY[*]}"
done
"""


def bash_complete(path: Path, lines: list[str]) -> list[set[str]]:
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", BASH_HARNESS, "harness", str(path)],
                          input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0].startswith("complete ") and out[0].endswith(" fleetllm")
    return [set(reply.split()) for reply in out[1:]]


def test_bash_completes_every_command_and_every_option(tmp_path: Path) -> None:
    path = tmp_path / "fleetllm.bash"
    path.write_text(script("bash"))
    subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)
    (tmp_path / "fleet").mkdir()
    (tmp_path / "fleet.yaml.bak").write_text("")
    options = every_option()
    lines = ["fleetllm ", "fleetllm va", "fleetllm re", "fleetllm --v", "fleetllm validate --format ",
             "fleetllm completion ", f"fleetllm validate {tmp_path}/fl", f"fleetllm plan --config {tmp_path}/fleet.y",
             *(f"fleetllm {name} -" for name in options)]
    replies = bash_complete(path, lines)
    assert replies[0] == {c.name for c in COMMANDS}
    assert replies[1] == {"validate"}
    assert replies[2] == {"render", "reconcile", "resume"}
    assert replies[3] == {"--version"}
    assert replies[4] == {"text", "json", "github"}
    assert replies[5] == {"bash", "zsh", "fish"}
    assert replies[6] == {f"{tmp_path}/fleet"}  # DIR: directories only
    assert replies[7] == {f"{tmp_path}/fleet.yaml.bak"}  # FILE: files
    for (name, wanted), reply in zip(options.items(), replies[8:], strict=True):
        assert set(wanted) <= reply, f"fleetllm {name} -: missing {set(wanted) - reply}"


@pytest.mark.integration
def test_fish_completes_commands_options_and_values(tmp_path: Path) -> None:
    if shutil.which("fish") is None:
        pytest.skip("fish is not installed (apt-get install fish; .ci/run installs it)")
    path = tmp_path / "fleetllm.fish"
    path.write_text(script("fish"))
    subprocess.run(["fish", "--no-config", "-n", str(path)], check=True, timeout=30)

    def complete(line: str) -> set[str]:
        done = subprocess.run(["fish", "--no-config", "-c", f"source {path}; complete -C '{line}'"],
                              capture_output=True, text=True, timeout=60, check=True)
        return {row.split("\t")[0] for row in done.stdout.splitlines()}

    assert complete("fleetllm ") == {c.name for c in COMMANDS}
    assert complete("fleetllm re") == {"render", "reconcile", "resume"}
    assert {"--config", "--listen", "--insecure-http", "--check", "--log-level"} <= complete("fleetllm serve --")
    assert complete("fleetllm validate --format ") == {"text", "json", "github"}
    assert complete("fleetllm completion ") == {"bash", "zsh", "fish"}


@pytest.mark.integration
def test_zsh_completes_commands_options_and_values(tmp_path: Path) -> None:
    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed (apt-get install zsh; .ci/run installs it)")
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "_fleetllm").write_text(script("zsh"))
    subprocess.run(["zsh", "-n", str(functions / "_fleetllm")], check=True, timeout=30)

    def complete(line: str) -> set[str]:
        done = subprocess.run(["zsh", "-f", str(HERE / "zsh_complete.zsh"), str(functions), line],
                              capture_output=True, text=True, timeout=60, check=True, cwd=ROOT)
        return set(done.stdout.split())

    assert complete("fleetllm ") >= {c.name for c in COMMANDS}
    assert complete("fleetllm va") == {"validate"}
    assert {"--config", "--listen", "--insecure-http", "--check"} <= complete("fleetllm serve --")
    assert complete("fleetllm completion ") == {"bash", "zsh", "fish"}
