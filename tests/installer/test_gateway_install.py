"""The installer on a gateway box, without supervisord: the box JSON's gateway, the programs, the
credentials and config files, the Python that runs the gateway, the gateway's own --check, dry run
and report."""

from __future__ import annotations

import importlib.machinery
import json
import shlex
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetllm_installer.boxgateway import BoxGatewayError, find_python, python_candidates
from fleetllm_installer.boxjson import BoxJsonError, parse_box
from fleetllm_installer.main import main
from fleetllm_installer.settings import load
from fleetllm_installer.units import MARKER
from tests.installer.conftest import BOX, FakeControlPlane, free_port, render, write_fleet
from tests.installer.test_units import parse_program


@pytest.fixture
def gateway_port() -> int:
    return free_port()


@pytest.fixture
def gateway_json(tmp_path: Path, ports: list[int], gateway_port: int) -> dict[str, Any]:
    fleet = write_fleet(tmp_path / "gwfleet", [gateway_port], [("small", ports[0], None), ("large", ports[1], None)],
                        gateway=gateway_port)
    return render(fleet)


@pytest.fixture
def env(box_env: Path, control_plane: FakeControlPlane, gateway_json: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> Path:
    control_plane.boxes[BOX] = gateway_json
    monkeypatch.setenv("FLEETLLM_URL", control_plane.url)
    return box_env


def secrets(doc: dict[str, Any]) -> list[str]:
    return [doc["gateway"]["api_key"], *(s["api_key"] for s in doc["servers"])]


# -- the box JSON -----------------------------------------------------------------------------------------

def test_the_rendered_gateway_parses(gateway_json: dict[str, Any], gateway_port: int, ports: list[int]) -> None:
    box = parse_box(gateway_json)
    assert box.gateway is not None and box.gateway.port == gateway_port
    assert box.gateway.digest == gateway_json["gateway"]["digest"]
    assert {s.name: s.listen_host for s in box.servers} == {"large": "127.0.0.1", "small": "127.0.0.1"}
    assert gateway_json["gateway"]["api_key"] not in repr(box)


def broken(doc: dict[str, Any], change: Any) -> list[str]:
    copy = json.loads(json.dumps(doc))
    change(copy)
    with pytest.raises(BoxJsonError) as caught:
        parse_box(copy)
    return caught.value.problems


def test_gateway_problems_are_named(gateway_json: dict[str, Any]) -> None:
    def same_port(d: Any) -> None:
        d["gateway"]["port"] = d["servers"][0]["port"]
        d["gateway"]["config"]["port"] = d["servers"][0]["port"]
    assert any("is also a server's port" in p for p in broken(gateway_json, same_port))

    def other_config_port(d: Any) -> None:
        d["gateway"]["config"]["port"] = 1
    assert any(p.startswith("gateway.config.port: expected the gateway's port") for p in
               broken(gateway_json, other_config_port))

    def unknown_credential(d: Any) -> None:
        d["gateway"]["config"]["authTokens"] = ["${cred:someone-else}"]
    assert broken(gateway_json, unknown_credential) == [
        "gateway.config: credential 'someone-else' is neither 'client-token' nor bearer-<server> of a server in "
        "this JSON"]

    def bad_key(d: Any) -> None:
        d["gateway"]["api_key"] = "has spaces in it"
    problems = broken(gateway_json, bad_key)
    assert problems == ["gateway.api_key: expected 8-512 characters of A-Z a-z 0-9 _.+/=:@- (value not shown)"]

    def server_named_gateway(d: Any) -> None:
        d["servers"][0]["name"] = "gateway"
    assert any("would take the gateway's program name" in p for p in broken(gateway_json, server_named_gateway))

    def not_an_address(d: Any) -> None:
        d["servers"][0]["listen_host"] = "localhost; rm"
    assert any(".listen_host: expected an IP address" in p for p in broken(gateway_json, not_an_address))

    assert broken(gateway_json, lambda d: d.update(gateway=[])) == ["gateway: expected an object"]


def test_a_box_json_cannot_make_the_gateway_send_box_secrets_upstream(gateway_json: dict[str, Any]) -> None:
    """Issue 27: a box JSON's gateway headers used `${file:...}` and `${env:...}`, and the gateway sent a box
    file, the fleet key and PATH upstream. Only the credentials the installer writes may be referenced, and
    only servers on this box routed to; the gateway refuses the same itself (--box-json, in its program)."""
    name = sorted(gateway_json["gateway"]["config"]["models"])[0]

    def header(value: str) -> Any:
        return lambda d: d["gateway"]["config"]["models"][name]["headers"].update({"X-Leak": value})

    assert broken(gateway_json, header("${file:/etc/shadow}")) == [
        f"gateway.config.models.{name}.headers.X-Leak: ${{file:/etc/shadow}} is refused in a box JSON: the box's "
        "environment and files are not the control plane's to send; only ${cred:...} references are read"]
    (problem,) = broken(gateway_json, header("Bearer ${env:FLEETLLM_FLEET_KEY} ${env:PATH}"))[:1]
    assert problem.startswith(f"gateway.config.models.{name}.headers.X-Leak: ${{env:FLEETLLM_FLEET_KEY}} is refused")
    assert broken(gateway_json, lambda d: d["gateway"]["config"].update(authTokens=["${env:HOME}"])) == [
        "gateway.config.authTokens[0]: ${env:HOME} is refused in a box JSON: the box's environment and files are "
        "not the control plane's to send; only ${cred:...} references are read"]
    literal = json.loads(json.dumps(gateway_json))
    literal["gateway"]["config"]["models"][name]["headers"]["X-Literal"] = "$${env:PATH}"
    assert parse_box(literal).gateway is not None  # `$$` is a literal `$`: nothing is read

    def remote(d: Any) -> None:
        d["gateway"]["config"]["models"][name]["url"] = "http://203.0.113.5:8001"
    assert broken(gateway_json, remote) == [
        f"gateway.config.models.{name}.url: the box gateway routes only to this box's servers (a loopback address "
        'or a unix socket), got "http://203.0.113.5:8001"']


# -- files and programs -----------------------------------------------------------------------------------

def test_install_writes_the_gateway_program_config_and_credentials(env: Path, control_plane: FakeControlPlane,
                                                                     gateway_json: dict[str, Any], gateway_port: int,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--handover", "none"]) == 0
    conf = env.parent / "conf.d"
    assert sorted(p.name for p in conf.iterdir()) == ["fleetllm-gateway.conf", "fleetllm-large.conf",
                                                      "fleetllm-small.conf"]
    state = env / "fleetllm"
    credentials = state / "gateway" / "credentials"
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o700
    expected = {"client-token": gateway_json["gateway"]["api_key"],
                **{f"bearer-{s['name']}": s["api_key"] for s in gateway_json["servers"]}}
    assert {p.name: p.read_text() for p in credentials.iterdir()} == {k: v + "\n" for k, v in expected.items()}
    for path in credentials.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    config = json.loads((state / "gateway" / "gateway.json").read_text())
    assert config == {**gateway_json["gateway"]["config"], "host": "127.0.0.1"}  # FLEETLLM_LISTEN_HOST
    assert stat.S_IMODE((state / "bin" / "fleetllm-gateway.pyz").stat().st_mode) == 0o700

    program = parse_program(conf / "fleetllm-gateway.conf")
    assert shlex.split(program.command) == [sys.executable, str(state / "bin" / "fleetllm-gateway.pyz"), "gateway",
                                            "--box-json", "--config", str(state / "gateway" / "gateway.json")]
    assert program.directory == str(state / "gateway")
    assert program.environment["CREDENTIALS_DIRECTORY"] == str(credentials)
    assert program.environment["FLEETLLM_DIGEST"] == gateway_json["gateway"]["digest"]
    assert program.environment["FLEETLLM_FLEET_KEY"] == ""
    assert (program.stopsignal, program.stopwaitsecs, program.stopasgroup) == (15, 10, True)
    assert program.stdout_logfile == str(state / "logs" / "gateway.log")
    assert program.stdout_logfile_backups == 5
    assert (conf / "fleetllm-gateway.conf").read_text().splitlines()[0] == MARKER
    assert not any(secret in (conf / "fleetllm-gateway.conf").read_text() for secret in secrets(gateway_json))

    # The servers bind loopback, whatever FLEETLLM_LISTEN_HOST says.
    small = parse_program(conf / "fleetllm-small.conf")
    argv = shlex.split(small.command)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"

    (report,) = control_plane.reports
    assert report["gateway"] == {"port": gateway_port, "digest": gateway_json["gateway"]["digest"],
                                 "unit": "fleetllm-gateway", "state": "written"}
    assert report["message"] == "2 server(s) and the box gateway (Python modules) handed to supervisord (none)"
    output = capsys.readouterr()
    assert "valid (2 models, 2 listed)" in output.err
    for secret in secrets(gateway_json):
        assert secret not in output.out + output.err + json.dumps(report)


def test_loopback_wins_over_a_public_listen_host(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETLLM_LISTEN_HOST", "0.0.0.0")  # noqa: S104 - nothing binds in this test
    assert main(["--handover", "none"]) == 0
    conf = env.parent / "conf.d"
    argv = shlex.split(parse_program(conf / "fleetllm-large.conf").command)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--health-host") + 1] == "127.0.0.1"
    assert json.loads((env / "fleetllm" / "gateway" / "gateway.json").read_text())["host"] == "0.0.0.0"  # noqa: S104


def test_a_box_without_gateway_loses_its_files_and_program(env: Path, control_plane: FakeControlPlane,
                                                           tmp_path: Path, ports: list[int]) -> None:
    assert main(["--handover", "none"]) == 0
    credentials = env / "fleetllm" / "gateway" / "credentials"
    (credentials / "notes.txt").write_text("not ours")
    control_plane.boxes[BOX] = render(write_fleet(tmp_path / "plain", ports, [("small", ports[0], None)]))
    assert main(["--handover", "none"]) == 0
    assert sorted(p.name for p in (env.parent / "conf.d").iterdir()) == ["fleetllm-small.conf"]
    assert control_plane.reports[-1]["units_removed"] == ["fleetllm-gateway", "fleetllm-large"]
    assert "gateway" not in control_plane.reports[-1]
    assert [p.name for p in credentials.iterdir()] == ["notes.txt"]
    assert not (env / "fleetllm" / "gateway" / "gateway.json").exists()
    assert not (env / "fleetllm" / "bin" / "fleetllm-gateway.pyz").exists()


def test_a_server_leaving_takes_its_bearer_file(env: Path, control_plane: FakeControlPlane, tmp_path: Path,
                                               ports: list[int], gateway_port: int) -> None:
    assert main(["--handover", "none"]) == 0
    control_plane.boxes[BOX] = render(write_fleet(tmp_path / "one", [gateway_port], [("small", ports[0], None)],
                                                  gateway=gateway_port))
    assert main(["--handover", "none"]) == 0
    credentials = env / "fleetllm" / "gateway" / "credentials"
    assert sorted(p.name for p in credentials.iterdir()) == ["bearer-small", "client-token"]


def test_a_config_the_gateway_refuses_stops_the_install_before_anything_changes(
        env: Path, control_plane: FakeControlPlane, gateway_json: dict[str, Any]) -> None:
    gateway_json["gateway"]["config"]["maxBodyBytes"] = -1
    assert main(["--handover", "none"]) == 1
    (report,) = control_plane.reports
    assert report["outcome"] == "failed"
    assert "fails its --check" in report["message"]
    assert "config: maxBodyBytes must not be negative" in report["message"]
    assert not (env.parent / "conf.d").exists() and not (env / "fleetllm" / "gateway").exists()


def test_an_unwritable_digest_fails_the_install(env: Path, control_plane: FakeControlPlane,
                                               gateway_json: dict[str, Any]) -> None:
    gateway_json["gateway"]["digest"] = "sha256:not writable"
    assert main(["--handover", "none"]) == 1
    # refused with the box JSON now, by field name (it failed later, writing the program, before)
    assert "gateway.digest: expected a string of at most 128 letters, digits and _./+:=,@-" in \
        control_plane.reports[0]["message"]


def test_dry_run_shows_the_gateway_and_writes_nothing(env: Path, control_plane: FakeControlPlane,
                                                      gateway_json: dict[str, Any],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dry-run"]) == 0
    assert not env.exists() and not (env.parent / "conf.d").exists()
    out = capsys.readouterr().out
    assert "[program:fleetllm-gateway]" in out
    assert '"authTokens": [\n    "${cred:client-token}"\n  ]' in out
    assert "credentials (mode 0600): client-token, bearer-large, bearer-small" in out
    for secret in secrets(gateway_json):
        assert secret not in out
    assert control_plane.reports[0]["gateway"]["state"] == "written"


# -- the Python that runs the gateway ---------------------------------------------------------------------

def script(path: Path, first_line: str) -> Path:
    path.write_text(first_line + "\nprint('x')\n")
    path.chmod(0o755)
    return path


def test_the_vllm_scripts_interpreter_comes_first(tmp_path: Path) -> None:
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    script(venv / "python3", f'#!/bin/sh\nexec {sys.executable} "$@"')  # an image's Python with httptools
    script(venv / "vllm", f"#!{venv / 'python3'}")
    settings = load({"FLEETLLM_VLLM_BIN": str(venv / "vllm")}, need_control_plane=False)
    assert python_candidates(settings, sys.executable) == [str(venv / "python3"), sys.executable]
    assert find_python(settings, sys.executable)[0] == str(venv / "python3")


def test_an_env_shebang_is_skipped_and_an_explicit_python_is_the_only_one(tmp_path: Path) -> None:
    vllm = script(tmp_path / "vllm", "#!/usr/bin/env python3")
    settings = load({"FLEETLLM_VLLM_BIN": str(vllm)}, need_control_plane=False)
    assert python_candidates(settings, sys.executable) == [sys.executable]
    explicit = load({"FLEETLLM_VLLM_BIN": str(vllm), "FLEETLLM_GATEWAY_PYTHON": "/bin/false"},
                    need_control_plane=False)
    assert python_candidates(explicit, sys.executable) == ["/bin/false"]
    with pytest.raises(BoxGatewayError, match=r"imports httptools \(tried: /bin/false\); set FLEETLLM_GATEWAY_PYTHON"):
        find_python(explicit, sys.executable)


def test_a_python_without_httptools_is_passed_over(tmp_path: Path) -> None:
    """The gateway's HTTP server is httptools (llhttp): a Python that has aiohttp but not it cannot run it."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    script(venv / "python3", '#!/bin/sh\ncase "$2" in *"import httptools"*) exit 1;; esac\n'
                             f'exec {sys.executable} "$@"')  # imports aiohttp, not httptools
    script(venv / "vllm", f"#!{venv / 'python3'}")
    settings = load({"FLEETLLM_VLLM_BIN": str(venv / "vllm")}, need_control_plane=False)
    assert find_python(settings, sys.executable) == (sys.executable, importlib.machinery.EXTENSION_SUFFIXES[0])


def test_no_python_with_httptools_fails_the_install_with_what_to_do(env: Path, control_plane: FakeControlPlane,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETLLM_GATEWAY_PYTHON", "/bin/false")
    assert main(["--handover", "none"]) == 1
    assert "set FLEETLLM_GATEWAY_PYTHON" in control_plane.reports[0]["message"]
    assert not (env.parent / "conf.d").exists()
