"""The box agent's poll, apply and back-off logic against a real local HTTP server that answers
GET /vllm/config with an ETag (304 to a matching If-None-Match) and records POST /vllm/report; its
Supervisor program parsed by Supervisor's own parser; and the agent as a real process, stopped by
SIGTERM. Applying with a real supervisord and the real control plane: test_agent_integration.py."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from supervisor.options import ServerOptions, UnhosedConfigParser

from fleetllm_installer import __version__, fetch, logs
from fleetllm_installer import main as main_module
from fleetllm_installer.agent import MAX_BACKOFF_S, USER_AGENT, Agent, delay_s
from fleetllm_installer.agentsetup import render_agent_unit
from fleetllm_installer.boxjson import parse_box
from fleetllm_installer.fetch import Client
from fleetllm_installer.fit import Placement
from fleetllm_installer.main import Installer, main, save_applied
from fleetllm_installer.settings import Settings, load
from fleetllm_installer.units import MARKER, render_unit
from fleetllm_installer.zipapp import build_zipapp
from tests.installer.conftest import BOX, FLEET_KEY, free_port
from tests.installer.realprocs import wait_until


@pytest.fixture(autouse=True)
def agent_logs(capsys: pytest.CaptureFixture[str]) -> None:
    """The agent's lines, as its main() sets them up (JSON on stderr), into the captured stderr."""
    import argparse

    logs.setup(argparse.Namespace(log_level=None, log_format="json"), "fleetllm-agent")


@dataclass
class Plane:
    """GET /vllm/config (ETag: the body's sha256; 304 to If-None-Match) and POST /vllm/report.
    `script`: statuses forced on the next config GETs; `stall_s`: wait before answering."""

    document: Any
    raw: bytes | None = None
    script: list[int] = field(default_factory=list)
    stall_s: float = 0.0
    gets: list[dict[str, Any]] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def body(self) -> bytes:
        return self.raw if self.raw is not None else json.dumps(self.document).encode()

    def start(self) -> Plane:
        plane = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def send(self, status: int, body: bytes = b"", etag: str | None = None) -> None:
                self.send_response(status)
                if etag:
                    self.send_header("ETag", etag)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                if headers.get("authorization") != f"Bearer {FLEET_KEY}":
                    self.send(403, b'{"error": "forbidden"}')
                    return
                time.sleep(plane.stall_s)
                body = plane.body()
                etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
                status = plane.script.pop(0) if plane.script else (
                    304 if headers.get("if-none-match") == etag else 200)
                plane.gets.append({"headers": headers, "status": status})
                if status == 200:
                    self.send(200, body, etag)
                elif status == 304:
                    self.send(304, b"", etag)
                else:
                    self.send(status, b'{"error": "scripted"}')

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                plane.reports.append(json.loads(self.rfile.read(length)))
                self.send(200, b'{"status": "recorded"}')

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def with_agent(box_json: dict[str, Any], poll_s: int = 30) -> dict[str, Any]:
    return {**copy.deepcopy(box_json), "agent": {"poll_s": poll_s}}


@pytest.fixture
def plane(box_json: dict[str, Any], box_env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Plane]:
    served = Plane(with_agent(box_json)).start()
    monkeypatch.setenv("FLEETLLM_URL", served.url)
    yield served
    served.stop()


def settings_now() -> Settings:
    return load()


def make_agent(settings: Settings | None = None) -> Agent:
    settings = settings or settings_now()
    assert settings.url is not None
    client = Client(settings.url, FLEET_KEY, BOX, deadline_s=0.0, user_agent=USER_AGENT)
    return Agent(settings, client, uniform=lambda low, high: 1.0)


def conf_files(settings: Settings) -> dict[str, str]:
    if not settings.conf_dir.is_dir():
        return {}
    return {p.name: p.read_text() for p in sorted(settings.conf_dir.iterdir())}


@pytest.fixture
def running_unit(plane: Plane) -> Settings:
    """A program an earlier install left: any change on the box would show in conf.d."""
    settings = settings_now()
    settings.conf_dir.mkdir(parents=True)
    (settings.conf_dir / "fleetllm-small.conf").write_text(MARKER + "\n[program:fleetllm-small]\ncommand=/bin/true\n")
    return settings


def test_delay_is_jittered_and_backs_off_to_a_cap() -> None:
    assert delay_s(30, 0, lambda low, high: low) == pytest.approx(24.0)
    assert delay_s(30, 0, lambda low, high: high) == pytest.approx(36.0)
    assert delay_s(30, 1, lambda low, high: 1.0) == 60.0
    assert delay_s(30, 3, lambda low, high: 1.0) == 240.0
    assert delay_s(30, 50, lambda low, high: 1.0) == MAX_BACKOFF_S
    assert delay_s(3600, 5, lambda low, high: 1.0) == 3600.0  # never below the interval


def test_unchanged_config_is_a_304(plane: Plane) -> None:
    settings = settings_now()
    save_applied(settings, hashlib.sha256(plane.body()).hexdigest(), 30)  # what the installer applied
    agent = make_agent(settings)
    first = agent.poll()
    assert (first.fetch, first.result) == (200, "same")
    second = agent.poll()
    third = agent.poll()
    assert (second.fetch, third.fetch) == (304, 304)
    assert plane.gets[1]["headers"]["if-none-match"].startswith('"')
    assert "if-none-match" not in plane.gets[0]["headers"]
    assert plane.gets[1]["headers"]["user-agent"] == f"fleetllm-agent/{__version__}"
    assert plane.reports == []  # nothing applied, nothing reported
    assert not settings.conf_dir.exists()


@pytest.mark.parametrize("failure", [503, 500, 429, 404, 403, 401, "timeout", "refused"])
def test_a_failed_fetch_changes_nothing_and_backs_off(plane: Plane, running_unit: Settings, failure: int | str,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    before = conf_files(running_unit)
    if failure == "timeout":
        monkeypatch.setattr(fetch, "REQUEST_TIMEOUT_S", 0.3)
        plane.stall_s = 1.0
    elif failure == "refused":
        monkeypatch.setenv("FLEETLLM_URL", f"http://127.0.0.1:{free_port()}")
    else:
        plane.script = [int(failure)]
    agent = make_agent()
    outcome = agent.poll()
    assert outcome.fetch == "failed"
    assert agent.failures == 1
    assert agent.next_delay() == 2 * agent.poll_s  # backed off
    assert conf_files(running_unit) == before
    assert plane.reports == []
    lines = [line for line in capsys.readouterr().err.splitlines() if "agent:" in line]
    assert lines
    assert all("the box keeps its programs" in line for line in lines)
    assert FLEET_KEY not in capsys.readouterr().err


def test_recovery_resets_the_back_off(plane: Plane, capsys: pytest.CaptureFixture[str]) -> None:
    settings = settings_now()
    save_applied(settings, hashlib.sha256(plane.body()).hexdigest(), 30)
    plane.script = [503, 502]
    agent = make_agent(settings)
    agent.poll()
    agent.poll()
    assert agent.failures == 2
    assert agent.next_delay() == 120.0
    assert agent.poll().result == "same"
    assert agent.failures == 0
    assert agent.next_delay() == 30.0
    assert "agent: the control plane answers again" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["not-json", "bad-field", "no-fit"])
def test_a_refused_config_changes_nothing_and_is_reported_once(plane: Plane, running_unit: Settings, bad: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    before = conf_files(running_unit)
    if bad == "not-json":
        plane.raw = b'{"host": "box-a", "servers": [ oops'
    elif bad == "bad-field":
        plane.document["servers"][0]["port"] = "eighty"
    else:
        plane.document["servers"][0]["vram_gb"] = 5000  # more than the (fake) H100 holds
    agent = make_agent()
    outcome = agent.poll()
    assert outcome.result == "refused"
    (report,) = plane.reports
    assert report["outcome"] == ("fit_failed" if bad == "no-fit" else "failed")
    assert report["agent"] is True
    assert conf_files(running_unit) == before
    # The same config again: a 304, not a second report; the regular interval, no back-off.
    assert agent.poll().fetch == 304
    assert len(plane.reports) == 1
    assert agent.next_delay() == agent.poll_s
    assert FLEET_KEY not in capsys.readouterr().err


def test_a_config_the_installer_applied_while_the_agent_looked_is_not_applied_again(
        plane: Plane, running_unit: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The installer run that starts the agent writes what it applied last, just before it lets go of
    the install lock. An agent whose first poll read that state before it was written, and reached the
    lock after the installer let go, finds the served config applied: nothing written, nothing reported
    (it applied and reported it a second time, which test_agent_integration.py saw on a loaded machine)."""
    before = conf_files(running_unit)
    digest = hashlib.sha256(plane.body()).hexdigest()
    measure_fit = main_module.measure_fit

    def installer_finishes_meanwhile(*args: Any) -> Any:  # after the agent's look, before its lock
        save_applied(running_unit, digest, 7)
        return measure_fit(*args)

    monkeypatch.setattr(main_module, "measure_fit", installer_finishes_meanwhile)
    agent = make_agent(running_unit)
    outcome = agent.poll()
    assert (outcome.fetch, outcome.result) == (200, "same")
    assert plane.reports == []
    assert conf_files(running_unit) == before
    assert (agent.applied, agent.poll_s, agent.failures) == (digest, 7, 0)
    assert agent.poll().fetch == 304  # the ETag of the config it runs


def test_a_failed_gpu_probe_is_tried_again_not_refused(plane: Plane, running_unit: Settings,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-smi failing on a running box (a driver hiccup) says nothing about the config: the agent
    reports it and tries the same config again after a back-off instead of refusing it for good."""
    before = conf_files(running_unit)
    monkeypatch.setenv("FAKE_NVIDIA_SMI_EXIT", "9")
    agent = make_agent()
    assert agent.poll().result == "retry"
    assert plane.reports[-1]["outcome"] == "fit_failed"
    assert agent.failures == 1
    assert conf_files(running_unit) == before
    assert agent.poll().result == "retry"  # the same config looked at again, not skipped as refused
    assert agent.refused is None
    assert len(plane.reports) == 2
    assert agent.failures == 2


def test_an_internal_error_is_caught_and_logged_in_one_line(plane: Plane, running_unit: Settings,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    def broken(self: Installer) -> int:
        raise RuntimeError("a bug that quotes sk-secret")

    monkeypatch.setattr(Installer, "run", broken)
    agent = make_agent()
    outcome = agent.poll()
    assert (outcome.fetch, outcome.result) == ("failed", "error")
    assert agent.failures == 1
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if "internal error" in line]
    assert "RuntimeError" in line
    assert "sk-secret" not in err
    assert "Traceback" not in err


def test_agent_unit_parses_and_carries_no_secret_and_no_revision(tmp_path: Path, box_env: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETLLM_URL", "https://fleet.example.org")
    settings = load()
    unit = render_agent_unit(settings, "/usr/bin/python3", "sha256:abc")
    assert FLEET_KEY not in unit.text
    unit.path.parent.mkdir(parents=True)
    settings.log_dir.mkdir(parents=True)
    unit.path.write_text(unit.text)
    parser = UnhosedConfigParser()
    parser.read([str(unit.path)])
    (config,) = ServerOptions().processes_from_section(parser, "program:fleetllm-agent", "fleetllm-agent")
    assert shlex.split(config.command) == ["/usr/bin/python3", "-S", str(settings.agent_program_path), "agent"]
    env = config.environment
    assert env["LLMAO_HOST"] == BOX
    assert env["FLEETLLM_URL"] == "https://fleet.example.org"
    assert env["FLEETLLM_FLEET_KEY"] == ""  # an inherited key is blanked; the key is a credential file
    assert env["FLEET_KEY"] == ""
    assert env["CREDENTIALS_DIRECTORY"] == str(settings.agent_credentials_dir)
    assert not config.stopasgroup  # a supervisorctl update the agent started survives its stop
    # The agent's settings, read back from its program's environment, are the installer's.
    agent_settings = load({**env, "CREDENTIALS_DIRECTORY": str(tmp_path / "creds")},
                          need_control_plane=False)
    assert agent_settings.conf_dir == settings.conf_dir
    assert agent_settings.data_dir == settings.data_dir
    assert agent_settings.startsecs == settings.startsecs


def test_the_fleet_key_reaches_the_agent_as_a_credential_file(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "fleet-key").write_text("key-from-the-file-0001\n")
    env = {"LLMAO_HOST": BOX, "FLEETLLM_URL": "https://fleet.example.org", "FLEETLLM_DATA_DIR": str(tmp_path),
           "CREDENTIALS_DIRECTORY": str(creds), "FLEETLLM_FLEET_KEY": "", "FLEET_KEY": ""}
    assert load(env).fleet_key == "key-from-the-file-0001"
    assert load({**env, "FLEETLLM_FLEET_KEY": "from-env"}).fleet_key == "from-env"  # the installer's way first


def test_revision_alone_changes_no_program_supervisord_reads(tmp_path: Path, box_json: dict[str, Any]) -> None:
    """units.py writes the revision in a comment line: Supervisor's parser drops it, so `update` sees
    the same program and restarts nothing (test_agent_integration.py shows it on a real supervisord)."""
    settings = load({"FLEETLLM_DATA_DIR": str(tmp_path / "data"), "FLEETLLM_SUPERVISOR_CONF_DIR": str(tmp_path)},
                    need_control_plane=False)
    settings.log_dir.mkdir(parents=True)
    server = parse_box(box_json, BOX).servers[0]
    configs = []
    texts = []
    for revision in ("r1", "r2"):
        unit = render_unit(server, Placement((0,), 0.4, ()), ports={}, settings=settings, python="python3",
                           revision=revision, gpu_count=1)
        path = tmp_path / f"{revision}.conf"
        path.write_text(unit.text)
        parser = UnhosedConfigParser()
        parser.read([str(path)])
        (config,) = ServerOptions().processes_from_section(parser, f"program:{unit.program}", unit.program)
        configs.append(config)
        texts.append(unit.text)
    assert texts[0] != texts[1]
    assert [a for a, b in zip(texts[0].splitlines(), texts[1].splitlines(), strict=True) if a != b] == [
        f"; server {server.name} on port {server.port}, revision r1"]
    assert configs[0] == configs[1]  # ProcessConfig equality is what `reread` compares


def test_dry_run_shows_the_agent_program_without_the_key(plane: Plane, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dry-run", "--assume-gpus", "1x80"]) == 0
    out = capsys.readouterr().out
    assert "fleetllm-agent.conf" in out
    assert "fleetllm-agent.pyz agent" in out
    assert FLEET_KEY not in out
    assert not settings_now().agent_credentials_dir.exists()  # a dry run writes nothing
    (report,) = plane.reports
    assert report["outcome"] == "dry_run"
    assert "agent" not in report  # no agent was installed


def test_box_json_agent_field_is_checked(box_json: dict[str, Any]) -> None:
    assert parse_box(with_agent(box_json, 5), BOX).agent is not None
    assert parse_box(box_json, BOX).agent is None
    for bad in ({"poll_s": 4}, {"poll_s": 3601}, {"poll_s": "30"}, {"poll_s": True}, [], "yes"):
        with pytest.raises(ValueError, match="agent"):
            parse_box({**box_json, "agent": bad}, BOX)
    named = copy.deepcopy(box_json)
    named["servers"][0]["name"] = "agent"
    with pytest.raises(ValueError, match="box agent's program name"):
        parse_box(with_agent(named), BOX)


def test_sigterm_stops_the_agent_process_promptly(plane: Plane, tmp_path: Path) -> None:
    """The agent as it runs on a box: `python3 -S fleetllm-agent.pyz agent`, the key in a credential file."""
    settings = settings_now()
    save_applied(settings, hashlib.sha256(plane.body()).hexdigest(), 3600)
    app = tmp_path / "fleetllm-agent.pyz"
    build_zipapp(app)
    creds = tmp_path / "creds"
    creds.mkdir(mode=0o700)
    (creds / "fleet-key").write_text(FLEET_KEY + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("FLEETLLM_FLEET_KEY", "FLEET_KEY")}
    env["CREDENTIALS_DIRECTORY"] = str(creds)
    process = subprocess.Popen([sys.executable, "-S", str(app), "agent"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        wait_until("the agent's first poll", lambda: len(plane.gets) >= 1, 30)
        assert FLEET_KEY.encode() not in Path(f"/proc/{process.pid}/cmdline").read_bytes()
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=20)  # it sleeps up to an hour between polls otherwise
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0
    assert "agent: stopped" in output
    assert FLEET_KEY not in output
    assert plane.gets[0]["headers"]["user-agent"] == USER_AGENT
    assert len(plane.gets) == 1


def test_the_log_states_the_interval_the_agent_polls_at(plane: Plane, running_unit: Settings,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """An agent started before its installer saved the box JSON's poll_s (the demo's fleet says 5 s) said
    "about every 30 s" and then polled every 5 s: the log names the default as provisional, and every
    change of the interval."""
    agent = make_agent(running_unit)
    agent.stop.set()  # run() logs its first line and returns
    agent.run()
    first = [line for line in capsys.readouterr().err.splitlines() if "agent: polling" in line]
    assert len(first) == 1 and "about every 30 s until a box JSON gives its rollout.poll_s" in first[0]
    save_applied(running_unit, "0" * 64, 5)  # the installer that started the agent saves the box JSON's
    agent.load_state()
    assert agent.poll_s == 5
    assert "agent: now polling about every 5 s" in capsys.readouterr().err
    known = make_agent(running_unit)  # an agent restarted later knows it from the start
    known.stop.set()
    known.run()
    err = capsys.readouterr().err
    assert "about every 5 s" in err and "30 s" not in err and "until a box JSON" not in err
