"""The installer end to end (handover none): every failure path, files and modes, removal, dry run, report."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetllm_installer.main import main
from fleetllm_installer.units import MARKER
from fleetllm_installer.zipapp import build_zipapp
from tests.conftest import ROOT
from tests.installer.conftest import BOX, FakeControlPlane


@pytest.fixture
def env(box_env: Path, control_plane: FakeControlPlane, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEETLLM_URL", control_plane.url)
    return box_env


def conf_dir(data: Path) -> Path:
    return data.parent / "conf.d"


def bearers(box_json: dict[str, Any]) -> list[str]:
    return [s["api_key"] for s in box_json["servers"]]


def check_report_shape(report: dict[str, Any]) -> None:
    """The body agreed with the control plane, field by field."""
    assert set(report) == {"revision", "installer_version", "outcome", "message", "fit", "servers", "units_removed"}
    assert report["outcome"] in {"installed", "fit_failed", "failed", "dry_run"}
    assert isinstance(report["revision"], str)
    assert isinstance(report["installer_version"], str)
    assert isinstance(report["message"], str)
    fit = report["fit"]
    assert set(fit) == {"ok", "gpus", "vram_needed_gb", "vram_total_gb", "disk_needed_gb", "disk_free_gb", "problems"}
    assert isinstance(fit["ok"], bool)
    for number in ("vram_needed_gb", "vram_total_gb", "disk_needed_gb", "disk_free_gb"):
        assert isinstance(fit[number], (int, float))
    for gpu in fit["gpus"]:
        assert set(gpu) == {"index", "name", "memory_total_mib", "memory_free_mib"}
    assert all(isinstance(p, str) for p in fit["problems"])
    for server in report["servers"]:
        assert set(server) - {"gpu_memory_utilization"} == {"name", "port", "digest", "unit", "state"}
        assert server["state"] in {"written", "started", "failed"}
        assert 0 < server.get("gpu_memory_utilization", 0.5) <= 1  # its share, when a GPU was measured
    assert all(isinstance(u, str) for u in report["units_removed"])


def test_missing_environment_is_a_usage_error(box_env: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("LLMAO_HOST")
    assert main(["--handover", "none"]) == 2
    assert "LLMAO_HOST is not set" in capsys.readouterr().err


@pytest.mark.parametrize(("change", "message"), [
    ({"FLEETLLM_FLEET_KEY": "wrong-key"}, "refused the fleet key (403)"),
    ({"LLMAO_HOST": "box-z"}, "does not know the box 'box-z' (404)"),
])
def test_refused_fetch_writes_nothing(env: Path, control_plane: FakeControlPlane, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str], change: dict[str, str], message: str) -> None:
    for name, value in change.items():
        monkeypatch.setenv(name, value)
    assert main(["--handover", "none"]) == 1
    assert message in capsys.readouterr().err
    assert not conf_dir(env).exists()
    assert control_plane.reports == []


@pytest.mark.parametrize(("raw", "message"), [
    (b"{nope", "GET /vllm/config is not JSON"),
    (json.dumps({"host": BOX, "servers": [{"name": "x", "model": "m", "port": "80", "api_key": "sk-vllm-12345678"}]})
     .encode(), "servers[0].port: expected an integer"),
])
def test_bad_json_fails_and_is_reported(env: Path, control_plane: FakeControlPlane, raw: bytes, message: str) -> None:
    control_plane.raw_config = raw
    assert main(["--handover", "none"]) == 1
    assert not conf_dir(env).exists()
    (report,) = control_plane.reports
    check_report_shape(report)
    assert report["outcome"] == "failed"
    assert message in report["message"]


def test_fit_shortfall_fails_names_servers_and_is_reported(env: Path, control_plane: FakeControlPlane,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FAKE_NVIDIA_SMI_GPUS", "NVIDIA A10:23028:23000")
    assert main(["--handover", "none"]) == 1
    err = capsys.readouterr().err
    assert "will not fit: GPU 0 (NVIDIA A10, 22.5 GB): needs 40.0 GB [large 30.0 GB, small 10.0 GB]" in err
    assert not conf_dir(env).exists()
    (report,) = control_plane.reports
    check_report_shape(report)
    assert report["outcome"] == "fit_failed"
    assert report["fit"]["ok"] is False
    assert report["fit"]["gpus"] == [{"index": 0, "name": "NVIDIA A10", "memory_total_mib": 23028,
                                      "memory_free_mib": 23000}]
    assert report["fit"]["vram_needed_gb"] == 40


def test_no_nvidia_smi_is_a_fit_failure(env: Path, control_plane: FakeControlPlane, tool_bin: Path) -> None:
    (tool_bin / "nvidia-smi").unlink()
    assert main(["--handover", "none"]) == 1
    (report,) = control_plane.reports
    assert report["outcome"] == "fit_failed"
    assert any("nvidia-smi is not on PATH" in p for p in report["fit"]["problems"])


def test_install_writes_private_files_and_reports(env: Path, control_plane: FakeControlPlane, tool_bin: Path,
                                                  box_json: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--handover", "none"]) == 0
    files = sorted(p.name for p in conf_dir(env).iterdir())
    assert files == ["fleetllm-large.conf", "fleetllm-small.conf"]
    # `vllm` is written as the absolute path found on the installer's PATH, not left to supervisord's PATH.
    assert f" -- {tool_bin}/vllm serve org/small-model " in (conf_dir(env) / "fleetllm-small.conf").read_text()
    for name in files:
        assert stat.S_IMODE((conf_dir(env) / name).stat().st_mode) == 0o600
    launcher = env / "fleetllm" / "bin" / "fleetllm-launch"
    assert stat.S_IMODE(launcher.stat().st_mode) == 0o700
    assert (env / "fleetllm" / "logs").is_dir()
    assert (env / "hf-cache").is_dir()
    (report,) = control_plane.reports
    check_report_shape(report)
    assert report["outcome"] == "installed"
    assert report["revision"] == box_json["revision"]
    assert {(s["name"], s["unit"], s["state"]) for s in report["servers"]} == {
        ("large", "fleetllm-large", "written"), ("small", "fleetllm-small", "written")}
    assert {s["digest"] for s in report["servers"]} == {s["digest"] for s in box_json["servers"]}
    assert report["fit"]["ok"] is True
    output = capsys.readouterr()
    for bearer in bearers(box_json):
        assert bearer not in output.out + output.err
        assert bearer not in json.dumps(report)


def test_stale_units_are_removed_and_foreign_ones_kept(env: Path, control_plane: FakeControlPlane,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    conf = conf_dir(env)
    conf.mkdir()
    (conf / "fleetllm-old.conf").write_text(MARKER + "\n[program:fleetllm-old]\ncommand=/bin/true\n")
    (conf / "fleetllm-handmade.conf").write_text("[program:fleetllm-handmade]\ncommand=/bin/true\n")
    (conf / "vllm-legacy.conf").write_text("[program:vllm-legacy]\ncommand=/usr/local/bin/vllm serve m\n")
    assert main(["--handover", "none"]) == 0
    assert sorted(p.name for p in conf.iterdir()) == [
        "fleetllm-handmade.conf", "fleetllm-large.conf", "fleetllm-small.conf", "vllm-legacy.conf"]
    assert control_plane.reports[0]["units_removed"] == ["fleetllm-old"]
    assert "vllm-legacy.conf runs vLLM but was not written by fleetllm; left in place" in capsys.readouterr().err


def tree(root: Path) -> list[tuple[str, float]]:
    return sorted((str(p.relative_to(root)), p.stat().st_mtime) for p in root.rglob("*"))


def test_dry_run_touches_nothing(env: Path, control_plane: FakeControlPlane, box_json: dict[str, Any],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    conf = conf_dir(env)
    conf.mkdir()
    (conf / "fleetllm-old.conf").write_text(MARKER + "\n[program:fleetllm-old]\ncommand=/bin/true\n")
    before = tree(env.parent)
    assert main(["--dry-run"]) == 0
    assert tree(env.parent) == before
    out = capsys.readouterr().out
    assert f"# ==> {conf / 'fleetllm-small.conf'} (mode 0600) <==" in out
    assert "[program:fleetllm-large]" in out
    assert f"# would remove {conf / 'fleetllm-old.conf'}" in out
    assert "VLLM_API_KEY=\"<redacted sha256:" in out
    for bearer in bearers(box_json):
        assert bearer not in out
    (report,) = control_plane.reports
    assert report["outcome"] == "dry_run"


def test_failed_report_never_fails_the_box(env: Path, control_plane: FakeControlPlane,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    control_plane.report_status = 500
    assert main(["--handover", "none"]) == 0
    assert "could not report to the control plane (the install stands)" in capsys.readouterr().err
    assert (conf_dir(env) / "fleetllm-small.conf").exists()


def test_config_file_needs_no_control_plane(box_env: Path, box_json: dict[str, Any], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LLMAO_HOST", "FLEETLLM_FLEET_KEY"):
        monkeypatch.delenv(name)
    path = tmp_path / "box.json"
    path.write_text(json.dumps(box_json))
    assert main(["--config-file", str(path), "--handover", "none"]) == 0
    assert (conf_dir(box_env) / "fleetllm-large.conf").exists()


def test_assume_gpus_only_with_dry_run(box_env: Path) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--assume-gpus", "1x80"])
    assert caught.value.code == 2


def stdlib_env(tmp_path: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "FLEETLLM_DATA_DIR": str(tmp_path / "data"),
            "FLEETLLM_SUPERVISOR_CONF_DIR": str(tmp_path / "conf.d"), "HOME": str(tmp_path)}


def test_module_dry_run_from_the_installer_folder_with_the_standard_library_alone(tmp_path: Path,
                                                                                  box_json: dict[str, Any]) -> None:
    path = tmp_path / "box.json"
    path.write_text(json.dumps(box_json))
    # -S: no site-packages at all, so only the standard library, installer/ (the installer) and contract/
    # (the box contract) are importable: nothing of the control plane or the gateway.
    done = subprocess.run([sys.executable, "-S", "-m", "fleetllm_installer", "--dry-run", "--config-file", str(path),
                           "--assume-gpus", "1x80"], cwd=ROOT / "installer", capture_output=True, text=True,
                          env={**stdlib_env(tmp_path), "PYTHONPATH": str(ROOT / "contract")}, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "[program:fleetllm-small]" in done.stdout
    assert "--gpu-memory-utilization 0.325" in done.stdout
    assert not (tmp_path / "data").exists()


def test_zipapp_installs_the_launcher_from_inside_the_archive(tmp_path: Path, box_json: dict[str, Any]) -> None:
    app = tmp_path / "fleetllm-box.pyz"
    build_zipapp(app)
    path = tmp_path / "box.json"
    path.write_text(json.dumps(box_json))
    fake_smi = Path(__file__).resolve().parent.parent / "support" / "fake_nvidia_smi.py"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(fake_smi)
    env = stdlib_env(tmp_path)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    done = subprocess.run([sys.executable, "-S", str(app), "--config-file", str(path), "--handover", "none"],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    launcher = tmp_path / "data" / "fleetllm" / "bin" / "fleetllm-launch"
    assert launcher.read_text() == (ROOT / "installer" / "fleetllm_installer" / "launcher.py").read_text()
    assert os.access(launcher, os.X_OK)


def test_update_without_a_running_supervisord_fails_and_is_reported(env: Path, control_plane: FakeControlPlane,
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "supervisord.conf"
    config.write_text(f"[supervisorctl]\nserverurl=unix://{tmp_path}/no.sock\n")
    monkeypatch.setenv("FLEETLLM_SUPERVISOR_CONFIG", str(config))
    assert main(["--handover", "update"]) == 1
    (report,) = control_plane.reports
    assert report["outcome"] == "failed"
    assert "is supervisord running?" in report["message"]


def test_a_foreign_vllm_unit_on_one_of_our_ports_stops_the_install(env: Path, control_plane: FakeControlPlane,
                                                                   box_json: dict[str, Any]) -> None:
    conf = conf_dir(env)
    conf.mkdir()
    port = box_json["servers"][0]["port"]
    (conf / "vllm-qwen.conf").write_text(f"[program:vllm-qwen]\ncommand=/usr/local/bin/vllm serve m --port {port}\n")
    assert main(["--handover", "none"]) == 1
    assert sorted(p.name for p in conf.iterdir()) == ["vllm-qwen.conf"]
    (report,) = control_plane.reports
    assert report["outcome"] == "failed"
    assert f"vllm-qwen.conf (not written by fleetllm, so left in place) runs vLLM on port {port}" in report["message"]


def test_a_box_json_with_no_server_removes_every_program_even_without_a_gpu(
        env: Path, control_plane: FakeControlPlane, tool_bin: Path, box_json: dict[str, Any]) -> None:
    """Issue 25: a retiring box is served the contract's object with no server; nothing needs a GPU, so a
    broken nvidia-smi does not keep its programs running: every fleetllm program is removed and reported."""
    assert main(["--handover", "none"]) == 0
    assert sorted(p.name for p in conf_dir(env).iterdir()) == ["fleetllm-large.conf", "fleetllm-small.conf"]
    (tool_bin / "nvidia-smi").unlink()
    control_plane.boxes[BOX] = {"host": BOX, "revision": "r-retired", "servers": []}
    assert main(["--handover", "none"]) == 0
    assert list(conf_dir(env).iterdir()) == []
    report = control_plane.reports[-1]
    check_report_shape(report)
    assert (report["outcome"], report["revision"], report["servers"]) == ("installed", "r-retired", [])
    assert sorted(report["units_removed"]) == ["fleetllm-large", "fleetllm-small"]
