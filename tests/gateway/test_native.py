"""The gateway's compiled modules (fleetllm_gateway.native, tools/build_gateway_native.py): a real mypyc
build of this checkout, the whole gateway suite run on it, the box zipapp using it, and every build that
does not fit refused with a reason while the gateway runs on its Python modules."""

from __future__ import annotations

import importlib.machinery
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetllm_gateway import native
from fleetllm_installer.zipapp import build_zipapp
from tests.gateway.conftest import ROOT, TOKEN, free_port
from tests.support.native import SUFFIX, TAG, build_this_checkout

sys.path.insert(0, str(ROOT / "tools"))
from build_gateway_native import main as build_main

PACKAGE_DIR = str(ROOT / "gateway" / "fleetllm_gateway")
OTHER_SUFFIX = ".cpython-39-x86_64-linux-gnu.so"  # a Python this suite never runs on


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's gateway, compiled for this Python, as gateway/README.md shows it made."""
    return build_this_checkout(tmp_path_factory.mktemp("native"))


def test_the_build_command_takes_a_directory_or_a_directory_of_builds(capsys: pytest.CaptureFixture[str]) -> None:
    for wrong in ([], ["a", "b"], ["-x"], ["--builds"], ["--builds", "-x"], ["--builds", "a", "b"]):
        assert build_main(wrong) == 2, wrong
    assert capsys.readouterr().err.count("python tools/build_gateway_native.py DIR\n"
                                         "python tools/build_gateway_native.py --builds DIR\n") == 6
    assert build_main(["--help"]) == 0 and "With --builds, DIR is a directory of builds" in capsys.readouterr().out


def test_the_builds_form_replaces_only_this_pythons_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`--builds DIR` builds into DIR/<tag> (the layout the control plane serves), replacing that build and
    leaving the others; mypyc stands in here by the files it leaves (the real build: the fixture above)."""

    def mypyc(argv: list[str], *, cwd: Path, **_: object) -> subprocess.CompletedProcess[str]:
        assert argv[1:3] == ["-m", "mypyc"]
        (cwd / f"abc123__mypyc{SUFFIX}").write_bytes(b"runtime")
        for module in native.COMPILED:
            (cwd / "fleetllm_gateway" / f"{module}{SUFFIX}").write_bytes(b"module")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(subprocess, "run", mypyc)  # the tool's one subprocess
    builds = tmp_path / "builds"
    (builds / "cpython-39-x86_64-linux-gnu").mkdir(parents=True)  # another Python's: kept
    (builds / str(TAG)).mkdir()
    (builds / str(TAG) / "stale").write_text("")  # this Python's before: replaced
    assert build_main(["--builds", str(builds)]) == 0
    assert capsys.readouterr().out == (f"{builds / str(TAG)}: 10 modules compiled for Python "
                                       f"{sys.version.split()[0]} ({SUFFIX})\n")
    assert sorted(p.name for p in builds.iterdir()) == sorted(["cpython-39-x86_64-linux-gnu", str(TAG)])
    manifest = native.read_manifest(builds / str(TAG))
    native.check_contents(builds / str(TAG), manifest, lambda module: native.source_digest(module, PACKAGE_DIR))
    assert not (builds / str(TAG) / "stale").exists()
    assert build_main(["--builds", str(tmp_path / "new" / "builds")]) == 0  # the directory of builds made
    assert (tmp_path / "new" / "builds" / str(TAG) / native.MANIFEST).is_file()


def _env(build_dir: Path | str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, native.ENV: str(build_dir)}


def _status_in_child(build_dir: Path | str) -> dict[str, object]:
    """What a fresh interpreter makes of the build: its STATUS, and where fleetllm_gateway.app came from."""
    code = ("import json, fleetllm_gateway.app as app; from fleetllm_gateway import native as n; "
            "print(json.dumps({'compiled': n.STATUS.compiled, 'reason': n.STATUS.reason, 'app': app.__file__}))")
    done = subprocess.run([sys.executable, "-c", code], env=_env(build_dir), capture_output=True, text=True,
                          timeout=60, check=True)
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_the_build_holds_every_module_and_is_used(compiled: Path) -> None:
    manifest = json.loads((compiled / native.MANIFEST).read_text())
    assert sorted(manifest["modules"]) == sorted(native.COMPILED)
    assert manifest["suffix"] in importlib.machinery.EXTENSION_SUFFIXES
    status = _status_in_child(compiled)
    assert status["compiled"] is True and status["reason"] == ""
    assert str(status["app"]).startswith(str(compiled / "fleetllm_gateway" / "app.cpython-"))


def test_the_gateway_suite_passes_on_the_build(compiled: Path) -> None:
    """Every test of tests/gateway but those that reach into the modules (marked python_modules), with
    this process's modules and every gateway it starts compiled (its conftest refuses to run otherwise)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/gateway",
                           "--ignore", "tests/gateway/test_native.py", "-m", "not python_modules"],
                          cwd=ROOT, env={**os.environ, native.ENV: str(compiled)}, capture_output=True, text=True,
                          timeout=900)
    tail, last = done.stdout[-6000:] + done.stderr[-2000:], done.stdout.splitlines()[-1]
    assert done.returncode == 0, tail
    summary = re.search(r"(\d+) passed", last)
    assert summary is not None and int(summary.group(1)) >= 300, tail
    assert " failed" not in last and " skipped" not in last, tail


def _serve_from(command: list[str], env: dict[str, str], cwd: Path) -> tuple[str, bytes]:
    """Start a gateway, wait for its "listening" line, fetch /v1/models; its stderr so far and the answer."""
    port = free_port()
    config = cwd / "gateway.json"
    config.write_text(json.dumps({"host": "127.0.0.1", "port": port, "authTokens": [TOKEN],
                                  "models": {"m": {"url": "http://127.0.0.1:9"}}}))
    stderr_path = cwd / "stderr.log"
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen([*command, "--config", str(config), "--workers", "2"], env=env, cwd=cwd,
                                stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 60
        while '"event":"listening"' not in stderr_path.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, stderr_path.read_text()
            time.sleep(0.05)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            body = answer.read()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return stderr_path.read_text(), body


def test_the_box_zipapp_runs_the_gateway_compiled(compiled: Path, tmp_path: Path) -> None:
    """As on a box: the sources are members of the zipapp, the build beside it."""
    box = tmp_path / "box.pyz"
    build_zipapp(box)
    log, body = _serve_from([sys.executable, str(box), "gateway"], _env(compiled), tmp_path)
    listening = next(json.loads(line) for line in log.splitlines() if '"event":"listening"' in line)
    assert listening["compiled"] is True, log
    assert json.loads(body)["data"][0]["id"] == "m"


def _copy(compiled: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "build"
    shutil.copytree(compiled, copy)
    return copy


def _manifest_for_these_sources(**changes: object) -> str:
    """A manifest that fits this Python and these sources, but for `changes`."""
    return json.dumps({"format": 1, "suffix": SUFFIX, "runtime": "r__mypyc",
                       "modules": {m: native.source_digest(m, PACKAGE_DIR) for m in native.COMPILED}, **changes})


def test_a_build_of_other_sources_is_not_used_and_the_gateway_says_why(compiled: Path, tmp_path: Path) -> None:
    stale = _copy(compiled, tmp_path)
    manifest = json.loads((stale / native.MANIFEST).read_text())
    manifest["modules"]["response"] = "0" * 64
    (stale / native.MANIFEST).write_text(json.dumps(manifest))
    status = _status_in_child(stale)
    assert status["compiled"] is False and str(status["app"]).endswith("fleetllm_gateway/app.py")
    assert "another fleetllm_gateway/response.py than this one" in str(status["reason"])
    log, body = _serve_from([sys.executable, "-m", "fleetllm_gateway"], _env(stale), tmp_path)
    assert '"compiled modules not used, running the Python ones"' in log and "response.py" in log
    assert json.loads(next(line for line in log.splitlines() if '"event":"listening"' in line))["compiled"] is False
    assert json.loads(body)["data"][0]["id"] == "m"


def test_a_runtime_that_does_not_load_is_not_used(compiled: Path, tmp_path: Path) -> None:
    broken = _copy(compiled, tmp_path)
    runtime = json.loads((broken / native.MANIFEST).read_text())["runtime"]
    next(broken.glob(f"{runtime}.*")).write_bytes(b"not a shared object")
    status = _status_in_child(broken)
    assert status["compiled"] is False and "its runtime does not load" in str(status["reason"])


def test_a_runtime_named_with_a_leading_digit_is_a_plain_module_name(compiled: Path, tmp_path: Path) -> None:
    """mypyc names the runtime by a hex hash, which may start with a digit: the manifest check takes it
    (this one does not load, its init function keeps the old name: the check after the manifest's says so)."""
    renamed = _copy(compiled, tmp_path)
    manifest = json.loads((renamed / native.MANIFEST).read_text())
    old, new = manifest["runtime"], "0" + manifest["runtime"][1:]
    (renamed / f"{old}{SUFFIX}").rename(renamed / f"{new}{SUFFIX}")
    (renamed / native.MANIFEST).write_text(json.dumps({**manifest, "runtime": new}))
    status = _status_in_child(renamed)
    assert status["compiled"] is False and "its runtime does not load" in str(status["reason"])


@pytest.mark.parametrize(("change", "reason"), [
    ({"suffix": OTHER_SUFFIX}, "was built for another Python"),
    ({"format": 2}, "not a manifest of format 1"),
    ({"modules": {"app": "x"}}, "its runtime or modules are not this gateway's"),
    ({"runtime": "../elsewhere"}, "its runtime or modules are not this gateway's"),
])
def test_a_manifest_that_does_not_fit_names_what(tmp_path: Path, change: dict[str, object], reason: str) -> None:
    (tmp_path / native.MANIFEST).write_text(_manifest_for_these_sources(**change))
    with pytest.raises(native.NativeBuildError, match=re.escape(reason)):
        native.check(tmp_path, PACKAGE_DIR)


def test_a_missing_file_or_manifest_is_named(tmp_path: Path) -> None:
    with pytest.raises(native.NativeBuildError, match=r"MANIFEST.json: cannot be read .*unset FLEETLLM_GATEWAY_NATIVE"):
        native.check(tmp_path, PACKAGE_DIR)
    (tmp_path / native.MANIFEST).write_text("{")
    with pytest.raises(native.NativeBuildError, match="not JSON"):
        native.check(tmp_path, PACKAGE_DIR)
    (tmp_path / native.MANIFEST).write_text(_manifest_for_these_sources())
    with pytest.raises(native.NativeBuildError, match=re.escape(f"fleetllm_gateway/app{SUFFIX}: missing")):
        native.check(tmp_path, PACKAGE_DIR)


def test_a_source_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    with pytest.raises(native.NativeBuildError, match=r"app.py: cannot be read .*install the gateway with its sources"):
        native.source_digest("app", str(tmp_path))


def test_no_build_asked_for_is_no_warning(tmp_path: Path) -> None:
    status = _status_in_child("")
    assert status == {"compiled": False, "reason": "", "app": PACKAGE_DIR + "/app.py"}


@pytest.fixture
def _restore_status() -> Iterator[None]:
    saved = native.STATUS
    yield
    native.STATUS = saved


@pytest.mark.usefixtures("_restore_status")
def test_a_build_asked_for_after_the_modules_were_imported_is_not_used(tmp_path: Path) -> None:
    import fleetllm_gateway.app  # noqa: F401  (imported here, as by every test of this suite)

    path: list[str] = [PACKAGE_DIR]
    status = native.activate(str(tmp_path), path)
    assert not status.compiled and status.asked and "was imported before the build could be used" in status.reason
    assert path == [PACKAGE_DIR]
