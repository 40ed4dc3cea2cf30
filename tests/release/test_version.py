"""One version, written once (contract/fleetllm_contract/version.py): every other place derives it, and
any file of the repository that states another fleetllm version fails here."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import fleetllm
import fleetllm_gateway
import fleetllm_installer
from fleetllm_contract import version
from fleetllm_installer.zipapp import build_zipapp
from tests.conftest import ROOT

VERSION = version.__version__

VERSION_FILE = ROOT / "contract" / "fleetllm_contract" / "version.py"
IMAGE = "ghcr.io/fleetllm/fleetllm"  # the repository's own name: tests/release/test_workflow.py ties it
MAJOR_TAG = f"v{VERSION.split('.')[0]}"

# Ways a file states fleetllm's version (each captures it); a match that is not VERSION fails.
STATEMENTS = (
    re.compile(r"""^\s*(?:__version__|VERSION|version)\s*=\s*["'](\d+\.\d+\.\d+[^"']*)["']""", re.MULTILINE),
    re.compile(r"\bfleetllm[\w.-]*:v?(\d+\.\d+\.\d+(?:-[\w.]+)?)(?![\w.:])"),  # image tags (not deployment ids)
    re.compile(r"\bfleetllm(?:-installer|-gateway)?[ /]v?(\d+\.\d+\.\d+)\b"),  # --version, User-Agent
    re.compile(r"/fleetllm(?:/[\w./-]+)?@(v\d+(?:\.\d+)*)\b"),  # workflow and action pins (<owner>/fleetllm@v1)
    re.compile(r"\bfleetllm-ref:\s*[\"']?(v\d+(?:\.\d+)*)\b"),  # the reusable workflow's input
)
# History, and this file's own examples of stale statements.
NOT_STATEMENTS = {"CHANGELOG.md", "tests/release/test_version.py"}


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    files = []
    for name in filter(None, names):
        path = ROOT / name
        if name in NOT_STATEMENTS or not path.is_file() or path.suffix in {".png", ".pyz", ".whl", ".gz"}:
            continue
        files.append(path)
    return files


def test_the_version_is_written_once() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["hatch"]["version"]["path"] == str(VERSION_FILE.relative_to(ROOT))
    assert fleetllm.__version__ == fleetllm_installer.__version__ == fleetllm_gateway.__version__ == VERSION
    assert VERSION_FILE.read_text().count("__version__ =") == 1


def test_no_file_states_another_version() -> None:
    wrong = []
    for path in tracked_text_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for pattern in STATEMENTS:
            for match in pattern.finditer(text):
                if match.group(1).removeprefix("v") not in (VERSION, MAJOR_TAG.removeprefix("v")):
                    line = text.count("\n", 0, match.start()) + 1
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: {match.group(0)!r} (the version is {VERSION})")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("text", ["image: registry.example.com/fleetllm:0.1.0", 'version = "0.2.0"',
                                  "uses: fleetllm/fleetllm@v7", "uses: <owner>/fleetllm/.github/workflows/fleet-pr.yml@v2", "fleetllm-installer 0.0.9", "fleetllm-ref: v0",
                                  "docker build -t fleetllm-runpod:9.9.9 ."])
def test_the_scan_sees_a_stale_version(text: str) -> None:
    assert any(m.group(1) not in (VERSION, MAJOR_TAG) for p in STATEMENTS for m in p.finditer(text)), text


def test_the_manifests_run_the_released_image() -> None:
    images = set()
    for path in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml")):
        images.update(re.findall(r"^\s*image:\s*(\S+)", path.read_text(), re.MULTILINE))
    assert images == {f"{IMAGE}:{VERSION}"}


def test_the_box_zipapp_knows_its_version(tmp_path: Path) -> None:
    """The installer and the gateway run from the zipapp with `python3 -S`: no package metadata there."""
    box = tmp_path / "box.pyz"
    build_zipapp(box)
    for args, program in ((["--version"], "fleetllm-installer"), (["gateway", "--version"], "fleetllm-gateway")):
        done = subprocess.run([sys.executable, "-S", str(box), *args], capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"{program} {VERSION}"


def test_the_commands_say_the_version() -> None:
    bin_dir = Path(sys.executable).parent
    for command in (["fleetllm", "--version"], ["fleetllm-gateway", "--version"], ["fleetllm", "gateway", "--version"]):
        done = subprocess.run([str(bin_dir / command[0]), *command[1:]], capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().endswith(f" {VERSION}")



def changelog_problem(text: str, release: str) -> str | None:
    """Why the CHANGELOG does not release `release`, or None: its newest `## X.Y.Z` section must be that
    version, with at most an `Unreleased` section above it (changes after the release)."""
    headings = re.findall(r"^## \[?([^\]\s]+)\]?", text, re.MULTILINE)
    released = [h for h in headings if h.lower() != "unreleased"]
    if not released or released[0] != release:
        return f"CHANGELOG.md's newest release section is {released[0] if released else 'missing'}, the version {release}"
    if headings[:headings.index(released[0])] not in ([], ["Unreleased"]):
        return f"CHANGELOG.md has {headings[:headings.index(released[0])]} above {release}"
    return None


def test_the_changelog_has_this_versions_section_on_top() -> None:
    """The version states what the CHANGELOG releases, so `tools/release.py notes` has the release notes."""
    assert changelog_problem((ROOT / "CHANGELOG.md").read_text(), VERSION) is None


def test_a_changelog_out_of_step_fails() -> None:
    assert changelog_problem("# Changelog\n\n## Unreleased\n\n## 0.1.0\n", "1.0.0") is not None  # the bug
    assert changelog_problem("## Unreleased\n", "1.0.0") is not None
    assert changelog_problem("## 1.1.0\n\n## 1.0.0\n", "1.0.0") is not None
    assert changelog_problem("## Unreleased\n\n## Unreleased\n\n## 1.0.0\n", "1.0.0") is not None
    assert changelog_problem("## Unreleased\n- x\n\n## [1.0.0] - 2026-12-02\n", "1.0.0") is None
