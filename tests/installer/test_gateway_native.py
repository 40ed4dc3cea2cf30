"""The box gateway's compiled modules on the box (fleetllm_installer.gatewaynative): fetched for the
Python that runs the gateway, checked by the gateway itself, named in its program; and every way that
can fail (no build, a control plane that does not answer, an archive that is not a clean build, a build
of other sources) leaves the gateway on its Python modules with the reason in the log, never a failed
install. The control plane here is the installer tests' stand-in; tests/installer/test_native_delivery.py
runs the real one."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

from fleetllm_installer import gatewaynative
from fleetllm_installer.boxgateway import remove_gateway
from fleetllm_installer.fetch import Client
from fleetllm_installer.main import main
from fleetllm_installer.settings import load
from tests.installer.conftest import BOX, FLEET_KEY, FakeControlPlane, free_port, render, write_fleet
from tests.installer.test_units import parse_program
from tests.support.native import TAG, build_this_checkout

NATIVE_ENV = "FLEETLLM_GATEWAY_NATIVE"


def tar_of(members: dict[str, bytes], *, extra: list[tarfile.TarInfo] | None = None) -> bytes:
    """A gzipped tar of `members` (name -> bytes), plus any crafted headers in `extra`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for info in extra or []:
            archive.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return buffer.getvalue()


def archive_of(build: Path) -> bytes:
    return tar_of({p.relative_to(build).as_posix(): p.read_bytes() for p in sorted(build.rglob("*")) if p.is_file()})


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_this_checkout(tmp_path_factory.mktemp("native"))


@pytest.fixture
def plane() -> Any:
    plane = FakeControlPlane({BOX: {}}).start()
    yield plane
    plane.stop()


def client(plane: FakeControlPlane) -> Client:
    return Client(plane.url, FLEET_KEY, BOX, deadline_s=0)


# -- fetching and unpacking -------------------------------------------------------------------------------

def test_a_build_is_fetched_once_and_then_confirmed_by_its_etag(plane: FakeControlPlane, tmp_path: Path) -> None:
    members = {"MANIFEST.json": json.dumps({"suffix": f".{TAG}.so"}).encode(), "rt.so": b"\x7fELF",
               "fleetllm_gateway/app.so": b"app"}
    plane.natives[str(TAG)] = archive = tar_of(members)
    root = tmp_path / "native"
    first = gatewaynative.fetch(client(plane), root, str(TAG))
    digest = hashlib.sha256(archive).hexdigest()
    assert first.directory == root / digest
    assert first.note == f"fetched the compiled gateway {digest[:12]} for {TAG} ({len(archive)} bytes)"
    assert {p.relative_to(first.directory).as_posix(): p.read_bytes()
            for p in first.directory.rglob("*") if p.is_file()} == members
    assert (first.directory / "rt.so").stat().st_mode & 0o777 == 0o644

    again = gatewaynative.fetch(client(plane), root, str(TAG))
    assert again == gatewaynative.Fetched(first.directory, f"compiled gateway {digest[:12]} for {TAG}: unchanged")
    assert plane.requests[-1]["headers"]["if-none-match"] == f'"{digest}"'
    assert plane.requests[-1]["headers"]["authorization"] == f"Bearer {FLEET_KEY}"
    assert plane.requests[-1]["path"] == f"/vllm/gateway-native/{TAG}"


def test_no_build_for_this_python_is_the_python_modules(plane: FakeControlPlane, tmp_path: Path) -> None:
    fetched = gatewaynative.fetch(client(plane), tmp_path / "native", "cpython-39-x86_64-linux-gnu")
    assert fetched == gatewaynative.Fetched(None, "the control plane has no compiled gateway for "
                                                  "cpython-39-x86_64-linux-gnu")


def test_a_control_plane_that_does_not_answer_keeps_the_build_the_box_holds(plane: FakeControlPlane,
                                                                              tmp_path: Path) -> None:
    plane.natives[str(TAG)] = tar_of({"MANIFEST.json": json.dumps({"suffix": f".{TAG}.so"}).encode()})
    root = tmp_path / "native"
    have = gatewaynative.fetch(client(plane), root, str(TAG)).directory
    gone = Client(f"http://127.0.0.1:{free_port()}", FLEET_KEY, BOX, deadline_s=0)
    kept = gatewaynative.fetch(gone, root, str(TAG))
    assert kept.directory == have and kept.note.startswith(f"kept the compiled gateway {have.name[:12]} for {TAG}: "
                                                          "cannot reach")
    nothing = gatewaynative.fetch(gone, root, "cpython-312-x86_64-linux-gnu")  # holds none for that one
    assert nothing.directory is None and nothing.note.startswith("no compiled gateway for cpython-312")


def test_an_answer_whose_sha256_is_not_its_etag_is_not_used(plane: FakeControlPlane, tmp_path: Path) -> None:
    plane.natives[str(TAG)] = tar_of({"a": b"a"})
    plane.native_etags[str(TAG)] = '"' + "0" * 64 + '"'  # as if the answer were cut short, or of other bytes
    fetched = gatewaynative.fetch(client(plane), tmp_path / "native", str(TAG))
    assert fetched.directory is None
    assert "the answer's sha256 is not its ETag" in fetched.note


def _info(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, size, link
    return info


@pytest.mark.parametrize(("archive", "reason"), [
    (lambda: tar_of({"../escape.so": b"x"}), "member '../escape.so' is not a plain name of at most two levels"),
    (lambda: tar_of({"/etc/cron.d/x": b"x"}), "member '/etc/cron.d/x' is not a plain name"),
    (lambda: tar_of({"a/b/c.so": b"x"}), "member 'a/b/c.so' is not a plain name of at most two levels"),
    (lambda: tar_of({".hidden": b"x"}), "member '.hidden' is not a plain name"),
    (lambda: tar_of({}, extra=[_info("link.so", tarfile.SYMTYPE, link="/etc/passwd")]),
     "member 'link.so' is not a regular file"),
    (lambda: tar_of({"a.so": b"x"}, extra=[_info("b.so", tarfile.LNKTYPE, link="a.so")]),
     "member 'b.so' is not a regular file"),
    (lambda: tar_of({}, extra=[_info("fifo", tarfile.FIFOTYPE)]), "member 'fifo' is not a regular file"),
    (lambda: tar_of({"a.so": b"x"}, extra=[_info("a.so", size=1)]), "File exists"),
    (lambda: tar_of({f"m{i}.so": b"" for i in range(gatewaynative.MAX_MEMBERS + 1)}), "more than 64 members"),
    (lambda: tar_of({"big.so": b"\0" * 2048}), "more than 0 MiB unpacked"),
    (lambda: b"\x1f\x8b\x08\x00" + b"\0" * 40, "not usable"),
    (lambda: tar_of({"a.so": b"x" * 5000})[:-200], "not usable"),
    (lambda: b"not an archive", "not usable"),
])
def test_an_archive_that_is_not_a_clean_build_is_not_used_and_nothing_is_left(
        plane: FakeControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, archive: Any, reason: str) -> None:
    monkeypatch.setattr(gatewaynative, "MAX_UNPACKED", 1024)
    plane.natives[str(TAG)] = archive()
    root = tmp_path / "native"
    fetched = gatewaynative.fetch(client(plane), root, str(TAG))
    assert fetched.directory is None
    assert fetched.note.startswith(f"the compiled gateway for {TAG} is not usable: ")
    assert reason in fetched.note
    assert list(root.iterdir()) == []  # nothing unpacked stays, nothing outside it was written
    assert not (tmp_path / "escape.so").exists()


def test_prune_keeps_the_build_in_use_and_the_one_before(tmp_path: Path) -> None:
    root = tmp_path / "native"
    builds = [root / (str(i) * 64) for i in range(4)]
    for age, build in enumerate(builds):
        build.mkdir(parents=True)
        (build / "MANIFEST.json").write_text("{}")
        stamp = 1_000_000 + age
        os.utime(build, (stamp, stamp))
    (root / ".unpack-left-over").mkdir()
    (root / "not-a-build").mkdir()  # not named by a digest: not ours to remove
    removed = gatewaynative.prune(root, builds[0])
    assert sorted(removed) == sorted([builds[1], builds[2], root / ".unpack-left-over"])
    assert sorted(p.name for p in root.iterdir()) == sorted([builds[0].name, builds[3].name, "not-a-build"])
    assert gatewaynative.prune(root, None) == [builds[0]]  # none in use: the newest stays for the running one


# -- the installer ----------------------------------------------------------------------------------------

@pytest.fixture
def gateway_box(tmp_path: Path, box_env: Path, control_plane: FakeControlPlane, ports: list[int],
                monkeypatch: pytest.MonkeyPatch) -> FakeControlPlane:
    port = free_port()
    fleet = write_fleet(tmp_path / "gwfleet", [port], [("small", ports[0], None)], gateway=port)
    control_plane.boxes[BOX] = render(fleet)
    monkeypatch.setenv("FLEETLLM_URL", control_plane.url)
    monkeypatch.delenv(NATIVE_ENV, raising=False)
    return control_plane


def gateway_program(box_env: Path) -> Any:
    return parse_program(box_env.parent / "conf.d" / "fleetllm-gateway.conf")


def test_the_installer_names_the_build_the_gateway_runs(gateway_box: FakeControlPlane, box_env: Path, build: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    gateway_box.natives[str(TAG)] = archive = archive_of(build)
    assert main(["--handover", "none"]) == 0
    native = box_env / "fleetllm" / "gateway" / "native" / hashlib.sha256(archive).hexdigest()
    assert gateway_program(box_env).environment[NATIVE_ENV] == str(native)
    assert json.loads((native / "MANIFEST.json").read_text()) == json.loads((build / "MANIFEST.json").read_text())
    err = capsys.readouterr().err
    assert "; compiled modules)" in err  # the gateway's own --check ran on it
    assert f"fetched the compiled gateway {native.name[:12]} for {TAG}" in err
    assert gateway_box.reports[-1]["message"] == ("1 server(s) and the box gateway (compiled) handed to supervisord "
                                                  "(none)")

    assert main(["--handover", "none"]) == 0  # the next install: a 304, the same build
    assert gateway_program(box_env).environment[NATIVE_ENV] == str(native)
    assert f"compiled gateway {native.name[:12]} for {TAG}: unchanged" in capsys.readouterr().err
    natives = [r for r in gateway_box.requests if r["path"].startswith("/vllm/gateway-native/")]
    assert [r["headers"].get("if-none-match") for r in natives] == [None, f'"{native.name}"']


def other_sources(build: Path, tmp_path: Path) -> bytes:
    """The archive of `build` with a manifest saying it was made from another app.py (another version)."""
    other = tmp_path / "other"
    shutil.copytree(build, other)
    manifest = json.loads((other / "MANIFEST.json").read_text())
    manifest["modules"]["app"] = "0" * 64
    (other / "MANIFEST.json").write_text(json.dumps(manifest))
    return archive_of(other)


def test_a_build_of_other_sources_is_not_named_and_the_log_says_why(gateway_box: FakeControlPlane, box_env: Path,
                                                                    build: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    gateway_box.natives[str(TAG)] = other_sources(build, tmp_path)
    assert main(["--handover", "none"]) == 0
    assert gateway_program(box_env).environment[NATIVE_ENV] == ""
    err = capsys.readouterr().err
    assert "does not fit" in err and "was built from another fleetllm_gateway/app.py than this one" in err
    assert "the gateway runs its Python modules" in err
    assert gateway_box.reports[-1]["message"].startswith("1 server(s) and the box gateway (Python modules)")


def test_a_newer_build_that_does_not_fit_keeps_the_one_the_box_held(gateway_box: FakeControlPlane, box_env: Path,
                                                                    build: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A control plane upgraded to a newer version serves builds of newer sources than the box program a
    running box has (until it is provisioned again): the gateway stays on the build that fits it."""
    gateway_box.natives[str(TAG)] = good = archive_of(build)
    assert main(["--handover", "none"]) == 0
    held = box_env / "fleetllm" / "gateway" / "native" / hashlib.sha256(good).hexdigest()
    gateway_box.natives[str(TAG)] = newer = other_sources(build, tmp_path)
    assert main(["--handover", "none"]) == 0
    assert gateway_program(box_env).environment[NATIVE_ENV] == str(held)
    newer_name = hashlib.sha256(newer).hexdigest()
    assert (f"kept the compiled gateway {held.name[:12]}, as the compiled gateway {newer_name[:12]} does not fit: "
            in capsys.readouterr().err)
    assert gateway_box.reports[-1]["message"].startswith("1 server(s) and the box gateway (compiled)")
    assert sorted(p.name for p in held.parent.iterdir()) == sorted([held.name, newer_name])

    assert main(["--handover", "none"]) == 0  # the same newer build again: a 304 naming it, no download
    natives = [r for r in gateway_box.requests if r["path"].startswith("/vllm/gateway-native/")]
    assert natives[-1]["headers"]["if-none-match"] == f'"{held.name}", "{newer_name}"'
    assert natives[-1]["status"] == 304
    assert f"kept the compiled gateway {held.name[:12]}, as the compiled gateway {newer_name[:12]}" in \
        capsys.readouterr().err
    assert gateway_program(box_env).environment[NATIVE_ENV] == str(held)

    gateway_box.natives[str(TAG)] = b"damaged"
    assert main(["--handover", "none"]) == 0
    assert gateway_program(box_env).environment[NATIVE_ENV] == str(held)
    assert "the new one is not usable" in capsys.readouterr().err


def test_no_build_served_is_the_python_modules_and_the_install_stands(gateway_box: FakeControlPlane, box_env: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--handover", "none"]) == 0
    assert gateway_program(box_env).environment[NATIVE_ENV] == ""
    assert (f"the control plane has no compiled gateway for {TAG}: the gateway runs its Python modules"
            in capsys.readouterr().err)


def test_compiled_off_and_a_dry_run_fetch_nothing(gateway_box: FakeControlPlane, box_env: Path, build: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    gateway_box.natives[str(TAG)] = archive_of(build)
    assert main(["--handover", "none", "--dry-run"]) == 0
    assert not (box_env / "fleetllm" / "gateway" / "native").exists()
    monkeypatch.setenv("FLEETLLM_GATEWAY_COMPILED", "0")
    assert main(["--handover", "none"]) == 0
    assert gateway_program(box_env).environment[NATIVE_ENV] == ""
    assert not [r for r in gateway_box.requests if r["path"].startswith("/vllm/gateway-native/")]
    monkeypatch.setenv("FLEETLLM_GATEWAY_COMPILED", "maybe")
    with pytest.raises(ValueError, match="FLEETLLM_GATEWAY_COMPILED='maybe' is neither 1 nor 0"):
        load()


def test_a_box_without_a_gateway_removes_its_builds(box_env: Path) -> None:
    settings = load(need_control_plane=False)
    build = settings.gateway_native_dir / ("a" * 64)
    build.mkdir(parents=True)
    assert settings.gateway_native_dir in remove_gateway(settings)
    assert not settings.gateway_native_dir.exists()
