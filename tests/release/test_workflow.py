"""The release workflow (.github/workflows/release.yml) and tools/release.py: what it publishes is what the
manifests run and what the example fleet repository pins, all from the one version; the sdist and wheel it
checked go to PyPI by trusted publishing (docs/releasing.md), and CI (.github/workflows/ci.yml) checks the
wheel the same way; the gateway compiled for every Python a box may run it on goes into the image, where its
control plane serves it from."""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from fleetllm_contract import version
from fleetllm_contract.gatewaynative import ENV, tag_of
from fleetllm_gateway import native
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
    assert set(workflow()["jobs"]) == {"gateway-native", "release", "pypi"}


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


# The gateway compiled (job gateway-native): for each Python a box's vLLM image may run it on, on a runner of
# its own architecture (no emulation), in the manylinux_2_28 container (glibc 2.28 or newer).
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
RUNNERS = {"x86_64": "ubuntu-latest", "aarch64": "ubuntu-24.04-arm"}
REQUIREMENTS = ROOT / "tools" / "gateway-native-requirements.txt"


def native_job() -> dict[str, Any]:
    job = workflow()["jobs"]["gateway-native"]
    assert isinstance(job, dict)
    return job


def matrix_cells() -> list[dict[str, str]]:
    """The job's matrix as GitHub expands it: python x arch, each with the `include` entry of its arch."""
    matrix = native_job()["strategy"]["matrix"]
    cells = [{"python": python, "arch": arch} for python, arch in itertools.product(matrix["python"], matrix["arch"])]
    for cell in cells:
        for extra in matrix.get("include", []):
            if all(cell[key] == value for key, value in extra.items() if key in ("python", "arch")):
                cell.update(extra)
    return cells


def expand(template: str, cell: dict[str, str]) -> str:
    """`template` with its ${{ matrix.KEY }} expressions as one cell of the matrix has them."""
    return re.sub(r"\$\{\{ matrix\.(\w+) \}\}", lambda found: cell[found.group(1)], template)


def expected_tag(cell: dict[str, str]) -> str:
    """The tag a box whose gateway runs this cell's CPython asks for: that of its extension suffix."""
    tag = tag_of(f".cpython-{cell['python'].replace('.', '')}-{cell['arch']}-linux-gnu.so")
    assert tag is not None
    return tag


def script_line(script: str, start: str) -> str:
    found = [line for line in script.splitlines() if line.startswith(start)]
    assert len(found) == 1, (start, script)
    return found[0]


def bash(script: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(["bash", "-c", script], env={"PATH": os.environ["PATH"], **(env or {})},
                          capture_output=True, text=True, timeout=30, check=True)
    return done.stdout


def named_step(job_steps: list[dict[str, Any]], start: str) -> dict[str, Any]:
    return next(s for s in job_steps if s.get("name", "").startswith(start))


def test_the_gateway_is_compiled_for_four_pythons_on_two_architectures_in_manylinux() -> None:
    job, cells = native_job(), matrix_cells()
    assert sorted((cell["python"], cell["arch"]) for cell in cells) == sorted(itertools.product(PYTHONS, RUNNERS))
    assert job["runs-on"] == "${{ matrix.runner }}"
    assert all(cell["runner"] == RUNNERS[cell["arch"]] for cell in cells)
    assert {expand(job["container"], cell) for cell in cells} == {
        "quay.io/pypa/manylinux_2_28_x86_64", "quay.io/pypa/manylinux_2_28_aarch64"}
    assert "permissions" not in job  # the workflow's own: contents read
    build = named_step(job["steps"], "Compile the gateway")["run"]
    assert "-r tools/gateway-native-requirements.txt" in build  # the pinned mypy
    assert '"$python" tools/build_gateway_native.py --builds gateway-native' in build
    # Each cell's interpreter is the container's CPython of its version, and its one build is under the tag
    # a box of that Python asks for (the step fails on any other).
    for cell in cells:
        env = {key: expand(value, cell) for key, value in job["env"].items()}
        found = bash(f'{script_line(build, "python=")}\n{script_line(build, "tag=")}\necho "$python $tag"', env)
        version_ = cell["python"].replace(".", "")
        assert found.split() == [f"/opt/python/cp{version_}-cp{version_}/bin/python", expected_tag(cell)]
    assert 'test "$(ls gateway-native)" = "$tag"' in build
    uploaded = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert uploaded["with"]["path"] == "gateway-native/" and uploaded["with"]["if-no-files-found"] == "error"
    assert len({expand(uploaded["with"]["name"], cell) for cell in cells}) == len(cells)  # none overwrites another


def test_each_build_is_checked_where_it_was_made_as_a_box_runs_it(tmp_path: Path) -> None:
    """The check runs the gateway's --check on the build, in a new virtual environment with httptools and no
    mypy, and passes only on the line the gateway prints when the build's modules are the ones it runs."""
    check = named_step(native_job()["steps"], "Check the gateway runs it")["run"]
    assert '-m venv "$RUNNER_TEMP/box"' in check and "pip install --disable-pip-version-check --quiet httptools" in check
    assert 'FLEETLLM_GATEWAY_NATIVE="$BUILD"' in check and "-m fleetllm_gateway --check" in check
    runner_temp = {"RUNNER_TEMP": str(tmp_path)}
    bash(script_line(check, "echo '{"), runner_temp)  # the config it checks, in $RUNNER_TEMP/gateway.json
    for compiled in (True, False):  # the gateway's own --check line, with the build in use and without
        code = ("import sys; from fleetllm_gateway import cli, native; "
                f"native.STATUS = native.Status(compiled={compiled}, asked=True); "
                "sys.exit(cli.main(['--check', '--config', sys.argv[1]]))")
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "gateway.json")], capture_output=True,
                              text=True, timeout=60, check=True,
                              env={k: v for k, v in os.environ.items() if k != ENV})
        (tmp_path / "check.txt").write_text(done.stdout)
        grep = subprocess.run(["bash", "-c", script_line(check, "grep -q ")], env={**os.environ, **runner_temp},
                              timeout=30, check=False)
        assert (grep.returncode == 0) is compiled, done.stdout


def test_the_release_compiles_with_the_pinned_mypy() -> None:
    """One exact mypy (and mypyc's setuptools through its extra), the one the gateway suite passed on."""
    from packaging.requirements import Requirement

    lines = [line for line in REQUIREMENTS.read_text().splitlines() if line and not line.startswith("#")]
    assert len(lines) == 1 and re.fullmatch(r"mypy\[mypyc\]==\d+\.\d+\.\d+", lines[0]), lines
    pinned = lines[0].partition("==")[2]
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    mypy = next(Requirement(r) for r in dev if Requirement(r).name == "mypy")
    assert mypy.specifier.contains(pinned)  # a mypy the project's own type checking accepts


def test_the_release_puts_every_build_into_the_image() -> None:
    """Every gateway-native-* artifact into one directory, the named build context `gateway-native` of both
    image builds (the checked one and the published one), which replaces the Dockerfile's stage of that
    name; the Dockerfile copies that stage's /gateway-native/ (tests/release/test_image.py)."""
    assert workflow()["jobs"]["release"]["needs"] == "gateway-native"  # every build made and checked, or none
    uploaded = next(s for s in native_job()["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    fetched = next(s for s in steps() if s.get("uses", "").startswith("actions/download-artifact@"))
    assert fetched["uses"] == "actions/download-artifact@v4" and fetched["with"]["merge-multiple"] is True
    for cell in matrix_cells():
        assert fnmatch.fnmatchcase(expand(uploaded["with"]["name"], cell), fetched["with"]["pattern"])
    assert not fnmatch.fnmatchcase("python-distributions", fetched["with"]["pattern"])
    images = [s for s in steps() if s.get("uses", "").startswith("docker/build-push-action@")]
    assert [image["name"] for image in images] == ["Build the image", "Publish the image"]
    for image in images:
        name, _, context = image["with"]["build-contexts"].partition("=")
        assert name == "gateway-native" and fetched["with"]["path"] == f"{context}/gateway-native"
        assert steps().index(fetched) < steps().index(image)
    assert "COPY --from=gateway-native /gateway-native/ " in (ROOT / "Dockerfile").read_text()


def fake_build(directory: Path, tag: str, **digests: str) -> None:
    """A build as tools/build_gateway_native.py lays it out, of this checkout's gateway sources but for
    `digests`, its modules empty files: what is checked here is where it is and what it was made from."""
    suffix = f".{tag}.so"
    sources = ROOT / "gateway" / native.PACKAGE
    modules = {m: hashlib.sha256((sources / f"{m}.py").read_bytes()).hexdigest() for m in native.COMPILED}
    (directory / native.PACKAGE).mkdir(parents=True)
    for module in native.COMPILED:
        (directory / native.PACKAGE / f"{module}{suffix}").write_bytes(b"")
    (directory / f"r__mypyc{suffix}").write_bytes(b"")
    (directory / native.MANIFEST).write_text(json.dumps({"format": native.FORMAT, "suffix": suffix, "runtime": "r__mypyc",
                                                         "python": "3", "modules": {**modules, **digests}}))


def test_the_image_check_wants_every_build_served_by_the_control_plane(tmp_path: Path) -> None:
    """The image check's expected tags are the matrix's; its script, run against a directory of builds laid
    out as the image has them (<sys.prefix>/share/fleetllm/gateway-native), prints the tags the control plane
    serves and says why it serves a build of other sources not."""
    check = named_step(steps(), "Check the image")["run"]
    expected = bash(f'{script_line(check, "expected=")}\necho "$expected"').split()
    assert expected == sorted(expected_tag(cell) for cell in matrix_cells())
    script = check[check.index("<<'EOF'\n") + len("<<'EOF'\n"):check.index("\nEOF\n")]
    (tmp_path / "check.py").write_text(script)
    prefix = tmp_path / "opt-fleetllm"
    builds = prefix / "share" / "fleetllm" / "gateway-native"
    for tag in expected:
        fake_build(builds / tag, tag)
    fake_build(builds / "stale", expected[0], app="0" * 64)
    done = subprocess.run([sys.executable, "-c", "import runpy, sys; sys.prefix = sys.argv[1]; runpy.run_path(sys.argv[2])",
                           str(prefix), str(tmp_path / "check.py")], capture_output=True, text=True, timeout=60,
                          check=True)
    assert done.stdout.split() == expected
    assert "not served: " in done.stderr and "another fleetllm_gateway/app.py" in done.stderr, done.stderr


def test_the_docs_say_what_the_release_compiles_for_boxes_and_where_it_goes() -> None:
    text = RELEASING.read_text()
    for needed in ("`gateway-native`", "tools/gateway-native-requirements.txt", "manylinux_2_28",
                   "`/opt/fleetllm/share/fleetllm/gateway-native/<tag>/`", "`server.gateway_native`",
                   *(f"3.{minor}" for minor in (10, 11, 12, 13)), "runs the gateway's Python modules"):
        assert needed in text, needed
