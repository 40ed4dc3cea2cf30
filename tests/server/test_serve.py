"""`fleetllm serve`: --check, the loopback rule, and the real gunicorn process over HTTPS."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from fleetllm.adapters.state import open_store
from fleetllm.cli.main import main
from fleetllm.demo.procs import free_port as free_port  # re-exported for this package's tests
from fleetllm.demo.procs import stop
from tests.conftest import ROOT, git
from tests.server.conftest import ENV, FLEET_KEY, KNOWN_BOX, SECRETS, base_config, write_config
from tests.support.integration import missing


def tls_files(directory: Path) -> tuple[Path, Path, trustme.CA]:
    """A throwaway CA and a certificate for 127.0.0.1 (trustme, built on the cryptography package)."""
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    issued.cert_chain_pems[0].write_to_path(str(cert_path))
    issued.private_key_pem.write_to_path(str(key_path))
    key_path.chmod(0o600)
    return cert_path, key_path, ca


@pytest.fixture
def config_file(tmp_path: Path, fleet_git: Path) -> Path:
    return write_config(tmp_path / "cp.yaml", base_config(fleet_git, tmp_path / "state.db"))


@pytest.fixture
def env_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)


def test_check_ok(config_file: Path, env_secrets: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--config", str(config_file), "--check"]) == 0
    out = capsys.readouterr().out
    assert "ok: would serve" in out
    assert "(4 boxes, 7 servers)" in out


def test_check_accepts_a_short_salt_with_a_warning(config_file: Path, env_secrets: None,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A 12-character salt (an existing llmao fleet's) serves: every bearer stays as it is; a warning says
    how to move to a longer one, without the salt."""
    monkeypatch.setenv("SALT", "salt12chars!")
    assert main(["serve", "--config", str(config_file), "--check"]) == 0
    captured = capsys.readouterr()
    assert "ok: would serve" in captured.out
    assert "warning: secrets.vllm_api_salt: the bearer salt is shorter than 16 characters" in captured.err
    assert "Rotate the salt" in captured.err and "salt12chars!" not in captured.out + captured.err


def test_check_reports_invalid_config_and_missing_secrets(tmp_path: Path, config_file: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--config", str(config_file), "--check"]) == 1  # no env: references unresolved
    err = capsys.readouterr().err
    assert 'env var "SALT" not set' in err
    assert 'env var "FLEET_KEY" not set' in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("repo: {path: /x}\nsecrets: {vllm_api_salt: literally-the-salt}\nstate: {url: 'sqlite:///s'}\n")
    assert main(["serve", "--config", str(bad), "--check"]) == 1
    err = capsys.readouterr().err
    assert "not a secret reference" in err
    assert "literally-the-salt" not in err


def test_check_fails_without_a_valid_commit(tmp_path: Path, fleet_git: Path, env_secrets: None,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    (fleet_git / "placement.yaml").write_text("hosts:\n  203.0.113.10:\n    - [nope, 8001]\n")
    git(fleet_git, "commit", "-qam", "bad")
    git(fleet_git, "checkout", "-q", "--orphan", "only-bad")
    git(fleet_git, "commit", "-qm", "orphan bad")
    document = base_config(fleet_git, tmp_path / "state.db")
    document["repo"]["branch"] = "only-bad"
    assert main(["serve", "--config", str(write_config(tmp_path / "cp.yaml", document)), "--check"]) == 1
    err = capsys.readouterr().err
    assert "no valid commit on branch only-bad" in err
    assert "unknown model 'nope'" in err


def test_check_missing_branch_and_bad_repo(tmp_path: Path, fleet_git: Path, env_secrets: None,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    document = base_config(fleet_git, tmp_path / "state.db")
    document["repo"]["branch"] = "nope"
    assert main(["serve", "--config", str(write_config(tmp_path / "a.yaml", document)), "--check"]) == 1
    assert "branch 'nope' not found" in capsys.readouterr().err
    document = base_config(tmp_path / "not-a-repo", tmp_path / "state.db")
    (tmp_path / "not-a-repo").mkdir()
    assert main(["serve", "--config", str(write_config(tmp_path / "b.yaml", document)), "--check"]) == 1
    assert "not inside a git repository" in capsys.readouterr().err


def test_plain_http_only_on_loopback(config_file: Path, env_secrets: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--config", str(config_file), "--listen", "0.0.0.0:8080", "--check"]) == 1
    assert "refusing plain HTTP on 0.0.0.0:8080" in capsys.readouterr().err
    assert main(["serve", "--config", str(config_file), "--listen", "0.0.0.0:8080", "--insecure-http",
                 "--check"]) == 0
    assert main(["serve", "--config", str(config_file), "--listen", "[::1]:8080", "--check"]) == 0
    assert main(["serve", "--config", str(config_file), "--listen", "nope", "--check"]) == 2


def test_example_config_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    # The example as shipped, except that its repository path is made absolute and its state goes to tmp.
    example = (ROOT / "examples" / "control-plane.yaml").read_text()
    config = tmp_path / "cp.yaml"
    config.write_text(example.replace("path: ../fleet-repo-example", f"path: {ROOT / 'fleet-repo-example'}")
                      .replace("sqlite:///../.state/control-plane.sqlite3", "sqlite:///state/cp.sqlite3"))
    monkeypatch.setenv("FLEETLLM_FLEET_KEY", "example-fleet-key-0123")
    monkeypatch.setenv("FLEETLLM_VLLM_API_SALT", "example-salt-0123456789")
    monkeypatch.setenv("FLEETLLM_LEGACY_API_KEY", "sk-legacy-example")
    if git(ROOT, "branch", "--list", "main") == "":
        missing("this checkout has no local main branch")
    assert main(["serve", "--config", str(config), "--check"]) == 0
    out = capsys.readouterr().out
    assert "(4 boxes, 7 servers)" in out
    assert f"state store: SQLite {tmp_path / 'state' / 'cp.sqlite3'} (created on the first start)" in out
    assert not (tmp_path / "state").exists()  # --check writes no state


@pytest.fixture
def https_server(tmp_path: Path, fleet_git: Path) -> Iterator[tuple[str, ssl.SSLContext, Path,
                                                                   subprocess.Popen[bytes]]]:
    cert, key, ca = tls_files(tmp_path)
    document = base_config(fleet_git, tmp_path / "state.db")
    document["tls"] = {"cert": str(cert), "key": str(key)}
    config = write_config(tmp_path / "cp.yaml", document)
    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    env = {**os.environ, **ENV}
    process = subprocess.Popen([sys.executable, "-m", "fleetllm", "serve", "--config", str(config), "--listen",
                                f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    context = ssl.create_default_context()
    ca.configure_trust(context)
    base = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{base}/health", context=context, timeout=2).close()
                break
            except (urllib.error.URLError, ConnectionError, ssl.SSLError):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError((tmp_path / "serve.log").read_text()) from None
                time.sleep(0.2)
        yield base, context, tmp_path / "serve.log", process
    finally:
        stop(process, timeout_s=15)
        log.close()


def get(url: str, context: ssl.SSLContext, headers: dict[str, str]) -> tuple[int, dict[str, str], Any]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def test_real_server_over_https(https_server: tuple[str, ssl.SSLContext, Path, subprocess.Popen[bytes]],
                                tmp_path: Path) -> None:
    base, context, log_path, process = https_server
    status, headers, body = get(f"{base}/vllm/config", context, {"Authorization": f"Bearer {FLEET_KEY}",
                                                                  "X-LLMAO-Host": KNOWN_BOX})
    assert status == 200
    assert body["host"] == KNOWN_BOX
    assert len(body["servers"]) == 2
    assert headers["Cache-Control"] == "no-store"
    assert headers["X-Fleet-Revision"] == body["revision"]
    status, _, _ = get(f"{base}/vllm/config", context, {"Authorization": "Bearer wrong", "X-LLMAO-Host": KNOWN_BOX})
    assert status == 403
    status, _, health = get(f"{base}/health", context, {})
    assert status == 200
    assert health["hosts"] == 4
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):  # TLS, with a certificate from our CA only
        get(f"{base}/health", ssl.create_default_context(), {})
    deadline = time.monotonic() + 10  # the server writes its log lines in batches
    requests: list[dict[str, Any]] = []
    while len(requests) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
        lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
        requests = [line for line in lines if line["event"] == "box request"]
    assert [line["status"] for line in requests] == [200, 403]
    text = log_path.read_text()
    assert body["servers"][0]["api_key"] not in text
    for secret in SECRETS:
        assert secret not in text
    os.killpg(process.pid, signal.SIGTERM)  # a graceful stop writes out what is buffered
    assert process.wait(timeout=15) == 0
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        fetches = [(f.status, f.box, f.claimed_host) for f in store.recent_fetches()]
        assert fetches == [(403, None, KNOWN_BOX), (200, KNOWN_BOX, KNOWN_BOX)]
    finally:
        store.close()


def test_check_fails_when_a_box_cannot_render(tmp_path: Path, fleet_git: Path, env_secrets: None,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    document = base_config(fleet_git, tmp_path / "state.db")
    del document["secrets"]["legacy_api_key"]
    assert main(["serve", "--config", str(write_config(tmp_path / "cp.yaml", document)), "--check"]) == 1
    assert "box 198.51.100.23: server llama3.1-8b on 198.51.100.23:8000 is a legacy pair" in capsys.readouterr().err


def test_check_warns_on_a_short_fleet_key_and_still_serves(config_file: Path, env_secrets: None,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 16, finding 12: a 5-character fleet key passed silently. It is baked into every box's
    template, so it must keep working: a warning in --check and in the log, never a refusal."""
    monkeypatch.setenv("FLEET_KEY", "abcde")
    assert main(["serve", "--config", str(config_file), "--check"]) == 0
    captured = capsys.readouterr()
    assert "warning: secrets.fleet_key (${env:FLEET_KEY}) is 5 characters, shorter than 24" in captured.err
    assert "Rotate the fleet key" in captured.err
    # --check gives its verdict and warnings only, no log line (issue 19); `serve` itself logs the event.
    assert not [line for line in captured.err.splitlines() if line.startswith("{")]
    assert "abcde" not in captured.out + captured.err
    monkeypatch.setenv("FLEET_KEY", "k" * 24)
    assert main(["serve", "--config", str(config_file), "--check"]) == 0
    assert "fleet_key" not in capsys.readouterr().out
def check_run(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).parent / "fleetllm"), "serve", "--config", str(config), "--check"],
                          capture_output=True, text=True, env={**os.environ, **ENV}, timeout=120, check=False)


def test_check_writes_no_state_and_logs_nothing(tmp_path: Path, fleet_git: Path) -> None:
    # It used to create and migrate the state database and print a JSON log line before its verdict.
    state = tmp_path / "var" / "state.db"
    done = check_run(write_config(tmp_path / "cp.yaml", base_config(fleet_git, state)))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.startswith("ok: would serve ")
    assert f"state store: SQLite {state} (created on the first start)" in done.stdout
    assert not state.exists() and not state.parent.exists()
    # An existing store is read, never written.
    open_store(f"sqlite:///{state}").close()
    before = state.read_bytes()
    done = check_run(write_config(tmp_path / "cp.yaml", base_config(fleet_git, state)))
    assert done.returncode == 0 and f"state store: SQLite {state}" in done.stdout
    assert state.read_bytes() == before


def test_a_missing_repository_is_reported_once(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-repo"
    done = check_run(write_config(tmp_path / "cp.yaml", base_config(missing, tmp_path / "state.db")))
    assert done.returncode == 1
    assert done.stderr.strip() == f"fleetllm serve: {missing}: no such directory"
    assert done.stdout == ""
