"""The project's name is fleetllm. Its first name belonged to another distribution in the package registry
(a batch dispatcher that imports under the same top-level name), so the old name may appear only in
CHANGELOG.md, which tells the history: not in any path, file, command, variable, metric or document."""

from __future__ import annotations

import re
import subprocess
import tomllib

from tests.conftest import ROOT

OLD = "llm" + "fleet"  # spelled in two parts so that this file does not name it
# Any case, with or without a - or _; not where "llm" ends another name followed by "fleet" (vLLM's in a
# test's "vllm-fleet-key", or the new name's in FLEETLLM_FLEET_KEY).
OLD_NAME = re.compile(r"(?<!v)(?<!fleet)" + OLD.replace("llm", "llm[-_]?"), re.IGNORECASE)
HISTORY = {"CHANGELOG.md", "tests/release/test_name.py"}  # the history; this file's own spellings


def repository_files() -> list[str]:
    """Every file git tracks or would track (untracked but not ignored)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode()
    return [name for name in out.split("\0") if name and (ROOT / name).is_file()]


def test_no_path_carries_the_old_name() -> None:
    assert [name for name in repository_files() if OLD_NAME.search(name)] == []


def test_no_file_names_the_old_name_outside_the_changelog() -> None:
    found = []
    for name in repository_files():
        if name in HISTORY:
            continue
        data = (ROOT / name).read_bytes()
        if b"\0" in data[:8192]:  # binary (screenshots, plots): no text to name it
            continue
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if OLD_NAME.search(line):
                found.append(f"{name}:{number}: {line.strip()[:120]}")
    assert found == [], "the old name is still written here:\n" + "\n".join(found)


def test_the_pattern_finds_every_spelling() -> None:
    for spelling in (OLD, OLD.upper(), OLD.capitalize(), "LLM-fleet", "llm_fleet", f"{OLD}_contract", f"X{OLD}Y"):
        assert OLD_NAME.search(spelling), spelling
    for other in ("fleetllm", "realvllm-fleet-key", "FLEETLLM_FLEET_KEY", "fleetllm fleet", "FleetllmError"):
        assert not OLD_NAME.search(other), other


def test_every_name_the_distribution_installs_carries_the_new_name() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["name"] == "fleetllm"
    assert set(project["project"]["scripts"]) == {"fleetllm", "fleetllm-gateway"}
    packages = project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    assert sorted(p.rsplit("/", 1)[-1] for p in packages) == [
        "fleetllm", "fleetllm_contract", "fleetllm_gateway", "fleetllm_installer"]
