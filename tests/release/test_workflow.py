"""The release workflow (.github/workflows/release.yml) and tools/release.py: what it publishes is what the
manifests run and what the example fleet repository pins, all from the one version; the sdist and wheel it
checked go to PyPI by trusted publishing (docs/releasing.md), and CI (.github/workflows/ci.yml) checks the
wheel the same way."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from fleetllm_contract import version
from tests.conftest import ROOT


def _load_release() -> ModuleType:
    """tools/release.py (tools/ holds scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("fleetllm_release_tool", ROOT / "tools" / "release.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


release = _load_release()

VERSION = version.__version__
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
CI = ROOT / ".github" / "workflows" / "ci.yml"
RELEASING = ROOT / "docs" / "releasing.md"
EXAMPLE_PR = ROOT / "fleet-repo-example" / ".github" / "workflows" / "fleet-pr.yml"
VENV_BIN = Path(sys.executable).parent


def workflow(path: Path = WORKFLOW) -> dict[Any, Any]:
    loaded = yaml.safe_load(path.read_text())
    assert isinstance(loaded, dict)
    return loaded


def steps() -> list[dict[str, Any]]:
    return list(workflow()["jobs"]["release"]["steps"])


def example_repository() -> tuple[str, str]:
    """The repository and ref the example fleet repository takes fleetllm from."""
    job = yaml.safe_load(EXAMPLE_PR.read_text())["jobs"]["fleet"]
    repository, ref = job["with"]["fleetllm-repository"], job["with"]["fleetllm-ref"]
    assert job["uses"] == f"{repository}/.github/workflows/fleet-pr.yml@{ref}"
    return repository, ref


def test_actionlint_passes() -> None:
    found = shutil.which("actionlint", path=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    shellcheck = shutil.which("shellcheck", path=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    assert found and shellcheck, "actionlint and shellcheck are dev dependencies: run make venv"
    done = subprocess.run([found, f"-shellcheck={shellcheck}", str(WORKFLOW), str(CI)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_it_runs_on_a_release_tag_or_by_hand_with_the_permissions_it_needs() -> None:
    on = workflow()[True]  # YAML 1.1 reads the key `on` as true
    assert set(on) == {"push", "workflow_dispatch"}
    pattern = on["push"]["tags"][0]
    assert pattern == "v[0-9]+.[0-9]+.[0-9]+" and f"v{VERSION}"[0] == "v"
    assert workflow()["permissions"] == {"contents": "read"}
    assert workflow()["jobs"]["release"]["permissions"] == {"contents": "write", "packages": "write"}
    assert set(workflow()["jobs"]) == {"release", "pypi"}


def test_it_publishes_what_the_manifests_run_and_moves_what_the_examples_pin() -> None:
    repository, ref = example_repository()
    named = release.outputs(f"refs/tags/v{VERSION}", repository, [])
    assert named["version"] == VERSION and named["tag"] == f"v{VERSION}"
    assert ref == named["major"]  # the example pins the tag this workflow moves
    images = set()
    for path in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml")):
        images.update(re.findall(r"^\s*image:\s*(\S+)", path.read_text(), re.MULTILINE))
    assert images == {f"{named['image']}:{VERSION}"}
    published = next(s for s in steps() if s.get("name") == "Publish the image")
    assert published["with"]["push"] is True
    assert published["with"]["tags"].splitlines() == ["${{ steps.release.outputs.image }}:${{ steps.release.outputs.version }}",
                                                 "${{ steps.release.outputs.image }}:${{ steps.release.outputs.major }}"]
    naming = next(s for s in steps() if s.get("id") == "release")
    assert "python tools/release.py outputs" in naming["run"] and '"$GITHUB_OUTPUT"' in naming["run"]
    moving = next(s for s in steps() if s.get("name") == "Move the major tag")
    assert moving["if"] == "steps.release.outputs.move_major == 'true'"
    assert 'git push --force origin "refs/tags/$MAJOR"' in moving["run"]


def test_it_attaches_the_wheel_the_sdist_and_the_zipapp() -> None:
    build = next(s for s in steps() if s.get("name") == "Build the sdist, the wheel and the box zipapp")["run"]
    assert "python -m build --outdir dist" in build
    # The wheel installed and run outside the checkout (tests/release/test_wheel_install.py runs the same
    # tool), and the zipapp it built from the installed packages and ran with python -S is the one attached.
    assert 'python tools/release.py check dist --box "dist/fleetllm-box-$VERSION.pyz"' in build
    assert build.index("python -m build") < build.index("tools/release.py check") < build.index("SHA256SUMS")
    create = next(s for s in steps() if s.get("name") == "Create the GitHub release")["run"]
    assert 'gh release create "$TAG" dist/*' in create


def test_a_tag_must_name_the_version() -> None:
    with pytest.raises(release.ReleaseError, match=f"does not name this source's version {re.escape(VERSION)}"):
        release.outputs("refs/tags/v0.0.1", "fleetllm/fleetllm", [])
    assert release.outputs("refs/heads/main", "Some-Owner/FleetLLM", [])["image"] == "ghcr.io/some-owner/fleetllm"
    with pytest.raises(release.ReleaseError, match="not OWNER/NAME"):
        release.outputs("refs/heads/main", "no-slash", [])


@pytest.mark.parametrize(("version_", "tags", "moves"), [
    ("1.2.0", [], True),
    ("1.2.0", ["v1.0.0", "v1.1.9", "v1"], True),
    ("1.2.0", ["v1.2.0"], True),  # a re-run
    ("1.0.5", ["v1.1.0"], False),  # a fix on an older line leaves v1 on 1.1.0
    ("1.0.5", ["v2.0.0", "v0.9.0"], True),
    ("2.0.0", ["v1.9.9"], True),
])
def test_the_major_tag_never_moves_back(version_: str, tags: list[str], moves: bool) -> None:
    assert release.moves_major(version_, tags) is moves


def test_release_notes_are_the_changelog_section(tmp_path: Path) -> None:
    changelog = tmp_path / "CHANGELOG.md"
    changelog.write_text(f"# Changelog\n\n## Unreleased\n\n- next\n\n## {VERSION}\n\n- this one\n- and this\n\n"
                         "## 0.0.1\n\n- old\n")
    assert release.notes(changelog) == "- this one\n- and this\n"
    changelog.write_text("# Changelog\n\n## Unreleased\n\n- next\n")
    assert release.notes(changelog) == ""
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "release.py"), "outputs", "--ref", "refs/tags/v0.0.0",
                           "--repository", "a/b"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and done.stderr.startswith("release: ") and "Traceback" not in done.stderr


def test_it_publishes_the_checked_sdist_and_wheel_to_pypi_by_trusted_publishing() -> None:
    """issue 24, item 6: pypa/gh-action-pypi-publish, on a job of its own with `id-token: write` (and nothing
    else) in the environment `pypi`, after the release job; it uploads exactly the sdist and the wheel the
    release job built and checked, with no token or password (PyPI trusts the workflow, not a secret)."""
    on = workflow()[True]
    assert "workflow_call" not in on  # trusted publishing does not work from a reusable workflow
    named = [s.get("name") for s in steps()]
    kept = next(s for s in steps() if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert named.index("Build the sdist, the wheel and the box zipapp") < steps().index(kept)
    assert kept["with"]["name"] == "python-distributions" and kept["with"]["if-no-files-found"] == "error"
    assert kept["with"]["path"].splitlines() == ["dist/fleetllm-${{ steps.release.outputs.version }}.tar.gz",
                                           "dist/fleetllm-${{ steps.release.outputs.version }}-py3-none-any.whl"]
    assert workflow()["jobs"]["release"]["outputs"] == {"version": "${{ steps.release.outputs.version }}"}

    job = workflow()["jobs"]["pypi"]
    assert job["needs"] == "release"
    assert job["permissions"] == {"id-token": "write"}
    assert job["environment"] == {"name": "pypi",
                                  "url": "https://pypi.org/project/fleetllm/${{ needs.release.outputs.version }}/"}
    fetched, published = job["steps"]
    assert fetched["uses"] == "actions/download-artifact@v4"
    assert fetched["with"] == {"name": "python-distributions", "path": "dist"}
    assert published["uses"] == "pypa/gh-action-pypi-publish@release/v1"
    assert published["with"] == {"packages-dir": "dist/"}  # no user, password or repository-url: PyPI itself
    assert "secrets." not in yaml.safe_dump(job)


def test_the_docs_name_the_publisher_the_workflow_sets_up() -> None:
    """What a maintainer registers on PyPI must match the workflow exactly (PyPI refuses the token
    otherwise): the project, the repository, the workflow file and the environment."""
    text = RELEASING.read_text()
    repository, _ref = example_repository()
    for needed in ("`fleetllm`", f"`{repository.split('/')[0]}`", f"`{repository.split('/')[1]}`",
                   f"`{WORKFLOW.name}`", f"`{workflow()['jobs']['pypi']['environment']['name']}`",
                   "trusted publisher", "cannot run here"):
        assert needed in text, needed


def test_ci_builds_the_wheel_and_checks_it_as_the_release_does() -> None:
    job = workflow(CI)["jobs"]["wheel"]
    runs = "\n".join(s.get("run", "") for s in job["steps"])
    assert "python -m build --outdir dist" in runs
    assert "python tools/release.py check dist" in runs
    assert runs.index("python -m build") < runs.index("tools/release.py check")
