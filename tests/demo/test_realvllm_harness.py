"""Where `fleetllm demo --real-vllm` finds its harness, and that nothing the demo, the Makefile or the docs need
lies outside the repository (issue 26, item 3): the build script is the repository's own, a harness is
taken from the flag, the variable, beside the checkout or the default cache, and a missing one says what
to do."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from fleetllm.demo import realvllm
from fleetllm.demo.fleet import DemoError

ROOT = Path(__file__).resolve().parents[2]


def finished(prefix: Path) -> Path:
    """A prefix holding every file `Harness.missing` checks (no real vLLM: only the lookup is tested)."""
    for rel in ("venv/bin/vllm", "venv/bin/python", "env.sh", "models/tiny-llama/config.json"):
        (prefix / rel).parent.mkdir(parents=True, exist_ok=True)
        (prefix / rel).write_text("")
    return prefix


def test_the_build_script_is_the_repositorys_own() -> None:
    setup = realvllm.find_setup()
    assert setup == ROOT / "tools" / "vllm-cpu" / "setup.sh"
    assert (setup.parent / "make_tiny_model.py").is_file()
    assert realvllm.project_root() == ROOT
    done = subprocess.run(["bash", "-n", str(setup)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_a_harness_beside_the_checkout_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(realvllm.PREFIX_ENV, raising=False)
    checkout = tmp_path / "fleetllm"
    checkout.mkdir()
    beside = finished(tmp_path / "vllm-cpu")
    assert realvllm.locate(None, build=False, setup=None, root=checkout).prefix == beside.resolve()


def test_the_flag_and_the_variable_are_the_only_place_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkout = tmp_path / "fleetllm"
    checkout.mkdir()
    finished(tmp_path / "vllm-cpu")
    named = finished(tmp_path / "mine")
    assert realvllm.locate(named, build=False, setup=None, root=checkout).prefix == named.resolve()
    monkeypatch.setenv(realvllm.PREFIX_ENV, str(tmp_path / "absent"))
    with pytest.raises(DemoError) as caught:
        realvllm.locate(None, build=False, setup=None, root=checkout)
    assert str(tmp_path / "absent") in str(caught.value) and "vllm-cpu/config.json" not in str(caught.value)


def test_a_missing_harness_says_how_to_get_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(realvllm.PREFIX_ENV, raising=False)
    monkeypatch.setattr(realvllm, "DEFAULT_PREFIX", tmp_path / "cache")
    with pytest.raises(DemoError) as caught:
        realvllm.locate(None, build=False, setup=realvllm.find_setup(), root=tmp_path / "fleetllm")
    message = str(caught.value)
    for needed in ("--build-vllm-harness", "--vllm-harness PREFIX", realvllm.PREFIX_ENV, "tools/vllm-cpu/setup.sh",
                   str(tmp_path / "vllm-cpu"), str(tmp_path / "cache")):
        assert needed in message
    with pytest.raises(DemoError, match=r"not a checkout .*tools/vllm-cpu/setup\.sh"):
        realvllm.locate(None, build=True, setup=None, root=tmp_path / "fleetllm")


def test_a_failed_build_names_its_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(realvllm.PREFIX_ENV, raising=False)
    script = tmp_path / "setup.sh"
    script.write_text("echo building \"$1\"; exit 3\n")
    with pytest.raises(DemoError, match=r"failed \(exit 3\); see .*build.log"):
        realvllm.locate(tmp_path / "prefix", build=True, setup=script)
    assert "building" in (tmp_path / "prefix" / "build.log").read_text()


# What may still name ../shared: the offline LiteLLM harness, as the fallback the docs describe beside
# --litellm-harness. Anything else the user would need from there is a harness they do not have.
OPTIONAL_FALLBACK = re.compile(r"\.\./shared/litellm-offline")


def test_nothing_outside_the_repository_is_needed() -> None:
    done = subprocess.run(["git", "grep", "-n", "../shared", "--", "Makefile", "README.md", "docs", "reconciler",
                           "installer", "gateway", ".ci"],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line]
    assert lines, "the optional LiteLLM fallback is documented in README.md"
    others = [line for line in lines if not OPTIONAL_FALLBACK.search(line)]
    assert others == []
    readme = (ROOT / "README.md").read_text()
    assert "optional fallback" in readme and "--litellm-harness" in readme
    assert "litellm[proxy]" in readme and "tools/vllm-cpu/setup.sh" in readme
