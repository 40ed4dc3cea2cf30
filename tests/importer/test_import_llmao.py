"""`fleetllm import llmao`: llmao's files (every row form, a legacy pair, a 12-character salt) become a
fleet that validates, whose rendered bearers equal the box contract's derivation computed here
independently, with nothing secret written and nothing dropped silently."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetllm.adapters.git import read_directory
from fleetllm.cli.main import main
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.jsonvalue import freeze_mapping
from fleetllm.core.fleet.render import Bearers, render_box
from fleetllm.core.fleet.validate import validate_snapshot
from fleetllm.core.importer.llmao import SECRET, import_llmao
from fleetllm.settings import load_config

HERE = Path(__file__).parent / "llmao"
CONFIG, MODELS = HERE / "config.yaml", HERE / "models.yaml"
LEGACY = "198.51.100.23:8000"


def contract_bearer(salt: str, host: str, port: int) -> str:
    """The box contract, read literally: HMAC-SHA256(fleet.vllm_api_salt, "llmao.vllm.api_key\\n" + host +
    "\\n" + listen_port) -> "sk-vllm-" + urlsafe-base64, no padding; the salt stripped of surrounding
    whitespace and the host of ::ffff: (reference-system.md section 2)."""
    if host.startswith("::ffff:"):
        host = host[len("::ffff:"):]
    message = ("llmao.vllm.api_key" + "\n" + host + "\n" + str(port)).encode("utf-8")
    digest = hmac.new(salt.strip().encode("utf-8"), message, hashlib.sha256).digest()
    return "sk-vllm-" + base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def llmao_files() -> tuple[dict[str, Any], dict[str, Any]]:
    return yaml.safe_load(CONFIG.read_text()), yaml.safe_load(MODELS.read_text())


def run_import(capsys: pytest.CaptureFixture[str], out: Path, *extra: str) -> tuple[int, str, str]:
    code = main(["import", "llmao", "--config", str(CONFIG), "--models", str(MODELS), "--out", str(out),
                 "--legacy", LEGACY, *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FLEETLLM_VLLM_API_SALT", "FLEETLLM_LEGACY_API_KEY", "FLEETLLM_FLEET_KEY", "LLMAO_URL"):
        monkeypatch.delenv(name, raising=False)


def test_fixture_has_what_the_acceptance_asks_for() -> None:
    config, _ = llmao_files()
    rows = [row for rows in config["fleet"]["hosts"].values() for row in rows]
    assert {len(r) for r in rows} == {2, 3, 4} and any(r[2] is None for r in rows if len(r) == 4)
    assert len(config["fleet"]["vllm_api_salt"]) == 12


def test_import_validates_and_keeps_every_bearer(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                 clean_env: None) -> None:
    out = tmp_path / "fleet"
    code, stdout, _ = run_import(capsys, out)
    assert code == 0, stdout
    validation = validate_snapshot(read_directory(out))
    assert validation.fleet is not None, validation.diagnostics
    fleet = validation.fleet
    config, _ = llmao_files()
    salt, legacy_key = config["fleet"]["vllm_api_salt"], config["fleet"]["selfhost_api_key"]
    bearers = Bearers(Salt(salt), legacy_key)
    checked = 0
    for host, rows in config["fleet"]["hosts"].items():
        box = host.removeprefix("::ffff:")
        rendered = {s["port"]: s for s in render_box(fleet, box, bearers)["servers"]}  # type: ignore[union-attr]
        for row in rows:
            model, port = row[0], row[1]
            expected = legacy_key if f"{box}:{port}" == LEGACY else contract_bearer(salt, host, port)
            server = rendered[port]
            assert server["api_key"] == expected, (host, port)
            assert server["name"] == (row[2] if len(row) > 2 and row[2] else model)
            checked += 1
    assert checked == 7
    box = fleet.box("203.0.113.24")
    assert box is not None and box.servers[1].public_port == 16643  # [model, port, null, public_port]
    assert fleet.settings.is_legacy("198.51.100.23", 8000)
    pod = fleet.box("k7v2m9x4q1w8e3")
    assert pod is not None and pod.provider is not None and pod.provider.value == "runpod"
    knobs = fleet.settings.reconcile
    assert (knobs.interval_s, knobs.probe_timeout_s, knobs.health_grace_s, knobs.down_after_failures) == (45, 3, 1800, 3)
    assert fleet.recipes["qwen3-8b"].vllm.served_model_name == "qwen3-8b"
    assert "gpt-4o" not in fleet.recipes


def test_no_secret_is_written_or_printed_and_the_control_plane_config_loads(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, clean_env: None) -> None:
    out = tmp_path / "fleet"
    code, stdout, stderr = run_import(capsys, out, "--check")
    assert code == 0, stdout + stderr
    config, _ = llmao_files()
    fleet = config["fleet"]
    secrets = [fleet["key"], fleet["vllm_api_salt"], fleet["selfhost_api_key"], fleet["vast"]["api_key"]]
    secrets += [contract_bearer(fleet["vllm_api_salt"], h, r[1]) for h, rows in fleet["hosts"].items() for r in rows]
    written = "".join(p.read_text() for p in out.iterdir() if p.is_file())
    for secret in secrets:
        assert secret not in written and secret not in stdout and secret not in stderr
    for name in ("FLEETLLM_FLEET_KEY", "FLEETLLM_VLLM_API_SALT", "FLEETLLM_LEGACY_API_KEY", "VAST_API_KEY",
                 "LITELLM_MASTER_KEY", "RUNPOD_API_KEY"):
        assert name in stdout
    assert "7 of 7 servers have the same bearer as llmao" in stdout
    assert "shorter than 16 characters" in stderr  # the 12-character salt: a warning, not a refusal
    env = {"FLEETLLM_FLEET_KEY": fleet["key"], "FLEETLLM_VLLM_API_SALT": fleet["vllm_api_salt"],
           "FLEETLLM_LEGACY_API_KEY": fleet["selfhost_api_key"], "VAST_API_KEY": fleet["vast"]["api_key"],
           "LITELLM_MASTER_KEY": "sk-master-test", "RUNPOD_API_KEY": "rp-test"}
    loaded = load_config(out / "control-plane.yaml", env=env)
    assert loaded.secrets.vllm_api_salt.short
    assert loaded.secrets.vllm_api_salt.derive("203.0.113.10", 8001) == contract_bearer(
        fleet["vllm_api_salt"], "203.0.113.10", 8001)
    assert loaded.providers.vast is not None and loaded.providers.static and loaded.providers.runpod is not None
    assert loaded.litellm is not None and loaded.litellm.url == "http://127.0.0.1:4000"


def test_every_field_not_carried_over_is_listed(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                clean_env: None) -> None:
    out = tmp_path / "fleet"
    code, stdout, _ = run_import(capsys, out)
    assert code == 0
    report = (out / "IMPORT-REPORT.md").read_text()
    for where in ("fleet.skew_interval_s", "fleet.litellm_health_interval_s", "model_info.vllm.source",
                  "(gpt-4o)", "config.yaml asfquart", "--served-model-name", "::ffff:203.0.113.24",
                  "model_info.context_window"):
        assert where in stdout and where in report, where
    placement = (out / "placement.yaml").read_text()
    assert "# fleet.hosts.::ffff:203.0.113.24[1]; public port 16643 written by hand" in placement
    assert "a legacy pair: shared fleet.selfhost_api_key" in placement
    assert "# from config.yaml fleet.health_interval_s" in (out / "fleet.yaml").read_text()
    code, _, stderr = run_import(capsys, out)
    assert code == 2 and "--force" in stderr  # never overwrites an import by accident


def test_the_mapping_is_pure_and_never_sees_a_secret() -> None:
    config, models = llmao_files()
    fleet = config["fleet"]
    for key in ("key", "vllm_api_salt", "selfhost_api_key"):
        fleet[key] = SECRET
    fleet["vast"]["api_key"] = SECRET
    frozen_config, frozen_models = freeze_mapping(config), freeze_mapping(models)
    legacy = frozenset({("198.51.100.23", 8000)})
    first = import_llmao(frozen_config, frozen_models, legacy)
    assert first == import_llmao(frozen_config, frozen_models, legacy)
    assert first.legacy == legacy
    assert SECRET not in json.dumps(str(first))


class FakeLlmao(BaseHTTPRequestHandler):
    """llmao's GET /vllm/config as the box contract describes it (fleet key, X-LLMAO-Host)."""

    fleet_key = ""
    salt = ""
    legacy_key = ""
    tamper: str | None = None

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {self.fleet_key}":
            self.send_error(403)
            return
        host = self.headers.get("X-LLMAO-Host", "")
        config, _ = llmao_files()
        rows = next((r for h, r in config["fleet"]["hosts"].items() if h.removeprefix("::ffff:") == host), None)
        if rows is None:
            self.send_error(404)
            return
        servers = []
        for row in rows:
            name = row[2] if len(row) > 2 and row[2] else row[0]
            key = self.legacy_key if f"{host}:{row[1]}" == LEGACY else contract_bearer(self.salt, host, row[1])
            if self.tamper == f"{host}:{row[1]}":
                key = contract_bearer(self.salt + "x", host, row[1])
            servers.append({"name": name, "port": row[1], "host": host, "api_key": key})
        body = json.dumps({"host": host, "servers": servers}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def fake_llmao() -> Iterator[str]:
    config, _ = llmao_files()
    FakeLlmao.fleet_key = config["fleet"]["key"]
    FakeLlmao.salt = config["fleet"]["vllm_api_salt"]
    FakeLlmao.legacy_key = config["fleet"]["selfhost_api_key"]
    FakeLlmao.tamper = None
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeLlmao)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_check_against_llmaos_box_json(capsys: pytest.CaptureFixture[str], tmp_path: Path, fake_llmao: str,
                                       monkeypatch: pytest.MonkeyPatch, clean_env: None) -> None:
    config, _ = llmao_files()
    monkeypatch.setenv("FLEETLLM_FLEET_KEY", config["fleet"]["key"])
    monkeypatch.setenv("FLEETLLM_VLLM_API_SALT", config["fleet"]["vllm_api_salt"])
    monkeypatch.setenv("FLEETLLM_LEGACY_API_KEY", config["fleet"]["selfhost_api_key"])
    code, stdout, _ = run_import(capsys, tmp_path / "a", "--check", "--llmao-url", fake_llmao)
    assert code == 0, stdout
    assert "against llmao's GET /vllm/config" in stdout and "7 of 7 servers" in stdout
    FakeLlmao.tamper = "203.0.113.10:8003"
    code, stdout, stderr = run_import(capsys, tmp_path / "b", "--check", "--llmao-url", fake_llmao)
    assert code == 1
    assert "MISMATCH 203.0.113.10 qwen3-8b-b:8003: differs: bearer" in stdout
    assert "sk-vllm-" not in stdout + stderr


def test_the_imported_control_plane_would_serve(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch, clean_env: None) -> None:
    out = tmp_path / "fleet"
    assert run_import(capsys, out)[0] == 0
    config, _ = llmao_files()
    fleet = config["fleet"]
    for name, value in (("FLEETLLM_FLEET_KEY", fleet["key"]), ("FLEETLLM_VLLM_API_SALT", fleet["vllm_api_salt"]),
                        ("FLEETLLM_LEGACY_API_KEY", fleet["selfhost_api_key"]),
                        ("VAST_API_KEY", fleet["vast"]["api_key"]), ("RUNPOD_API_KEY", "rp-test"),
                        ("LITELLM_MASTER_KEY", "sk-master-test")):
        monkeypatch.setenv(name, value)
    assert main(["serve", "--config", str(out / "control-plane.yaml"), "--check"]) == 0
    captured = capsys.readouterr()
    assert "ok: would serve" in captured.out and "(5 boxes, 7 servers)" in captured.out
    assert "shorter than 16 characters" in captured.err


AWS_SECRET = "aws-secret-Qm3Zk8Lp2Xv7"
HEADER_SECRET = "Bearer hdr-secret-Wd5Ty9Nc1"


def test_secrets_in_litellm_params_are_left_out_and_said(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                        clean_env: None) -> None:
    models = MODELS.read_text().replace(
        "      chat_template_kwargs: {enable_thinking: false}\n",
        "      chat_template_kwargs: {enable_thinking: false}\n"
        f"      aws_secret_access_key: {AWS_SECRET}\n"
        f"      extra_headers: {{Authorization: '{HEADER_SECRET}', X-Team: ml}}\n"
        "      aws_session_token: os.environ/AWS_SESSION_TOKEN\n"
        "      max_tokens: 512\n", 1)
    source = tmp_path / "models.yaml"
    source.write_text(models)
    code = main(["import", "llmao", "--config", str(CONFIG), "--models", str(source), "--out", str(tmp_path / "o"),
                 "--legacy", LEGACY])
    captured = capsys.readouterr()
    written = "".join(p.read_text(errors="replace") for p in (tmp_path / "o").rglob("*") if p.is_file())
    assert code == 0, captured.err
    assert AWS_SECRET not in written + captured.out + captured.err
    assert "hdr-secret-Wd5Ty9Nc1" not in written + captured.out + captured.err
    params = yaml.safe_load((tmp_path / "o" / "models.yaml").read_text())["models"]["qwen3-8b"]["litellm"]["params"]
    assert params["extra_headers"] == {"X-Team": "ml"} and params["max_tokens"] == 512
    assert params["aws_session_token"] == "os.environ/AWS_SESSION_TOKEN"  # LiteLLM's reference: kept
    assert "aws_secret_access_key" not in params
    assert "litellm_params.aws_secret_access_key" in captured.out + captured.err + written


@pytest.mark.parametrize(("text", "says"), [
    ("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)),
     "expands to more than"),
    ("models: " + "[" * 2000 + "]" * 2000 + "\n", "models.yaml:1:"),
    ("models:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 200)), "nesting deeper than"),
])
def test_llmao_yaml_is_read_within_the_strict_loaders_limits(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                            clean_env: None, text: str, says: str) -> None:
    source = tmp_path / "models.yaml"
    source.write_text(text)
    code = main(["import", "llmao", "--config", str(CONFIG), "--models", str(source), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code != 0 and says in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_force_replaces_a_symbolic_link_instead_of_writing_through_it(capsys: pytest.CaptureFixture[str],
                                                                      tmp_path: Path, clean_env: None) -> None:
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("keep me\n")
    for name in ("models.yaml", ".gitignore", "IMPORT-REPORT.md"):
        (out / name).symlink_to(victim)
    code, _, err = run_import(capsys, out, "--force")
    assert code == 0, err
    assert victim.read_text() == "keep me\n"
    assert not (out / "models.yaml").is_symlink() and "models:" in (out / "models.yaml").read_text()
