"""The CLI contract: exit codes 0/1/2, output formats, --rev from git objects."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetllm.cli.main import main
from tests.conftest import EXAMPLE, TEST_LEGACY_KEY, TEST_SALT, git
from tests.fleet.test_bearer import GOLDEN


@pytest.fixture(autouse=True)
def _no_ambient_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FLEETLLM_VLLM_API_SALT", "FLEETLLM_LEGACY_API_KEY", "GITHUB_ACTIONS"):
        monkeypatch.delenv(name, raising=False)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def break_placement(repo: Path) -> None:
    path = repo / "placement.yaml"
    path.write_text(path.read_text().replace("[llama3.1-8b, 8002]", "[llama3.1-8b, 8009]"))


def test_validate_example_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "validate", str(EXAMPLE))
    assert code == 0 and "valid at working-tree (4 boxes, 7 servers, 4 models)" in out


def test_validate_invalid_exits_1_with_positioned_errors(capsys: pytest.CaptureFixture[str], fleet_dir: Path) -> None:
    break_placement(fleet_dir)
    code, out, _ = run(capsys, "validate", str(fleet_dir))
    assert code == 1
    assert f"{fleet_dir}/placement.yaml:10:21: /hosts/203.0.113.10/1/1: port 8009 is not a listen port" in out
    assert "[port-not-listen]" in out and "1 error, 0 warnings" in out


def test_validate_missing_directory_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "validate", str(tmp_path / "nope"))
    assert code == 2 and "not a directory" in err


def test_validate_json_and_github_formats(capsys: pytest.CaptureFixture[str], fleet_dir: Path) -> None:
    break_placement(fleet_dir)
    code, out, _ = run(capsys, "validate", str(fleet_dir), "--format", "json")
    data = json.loads(out)
    assert code == 1 and data["valid"] is False and data["diagnostics"][0]["line"] == 10
    code, out, _ = run(capsys, "validate", str(fleet_dir), "--format", "github")
    assert code == 1
    assert out.splitlines()[0].startswith(f"::error file={fleet_dir}/placement.yaml,line=10,col=21,"
                                          "title=port-not-listen::")


def test_validate_rev_reads_git_objects_not_the_tree(capsys: pytest.CaptureFixture[str], fleet_git: Path) -> None:
    break_placement(fleet_git)  # uncommitted breakage
    assert run(capsys, "validate", str(fleet_git))[0] == 1
    code, out, _ = run(capsys, "validate", str(fleet_git), "--rev", "HEAD")
    assert code == 0 and git(fleet_git, "rev-parse", "HEAD") in out
    git(fleet_git, "commit", "-qam", "break it")
    assert run(capsys, "validate", str(fleet_git), "--rev", "HEAD")[0] == 1
    assert run(capsys, "validate", str(fleet_git), "--rev", "HEAD~1")[0] == 0
    code, _, err = run(capsys, "validate", str(fleet_git), "--rev", "no-such-branch")
    assert code == 2 and "no such revision" in err


def test_validate_rev_in_a_subdirectory_of_the_repo(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import shutil

    repo = tmp_path / "project"
    shutil.copytree(EXAMPLE, repo / "fleet", ignore=shutil.ignore_patterns(".github"))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "x")
    assert run(capsys, "validate", str(repo / "fleet"), "--rev", "HEAD")[0] == 0


def test_validate_outside_git_with_rev_exits_2(capsys: pytest.CaptureFixture[str], fleet_dir: Path) -> None:
    code, _, err = run(capsys, "validate", str(fleet_dir), "--rev", "HEAD")
    assert code == 2 and "not inside a git repository" in err


def test_render_prints_the_box_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    salt = tmp_path / "salt"
    salt.write_text(TEST_SALT + "\n")
    code, out, _ = run(capsys, "render", "203.0.113.10", "--repo", str(EXAMPLE), "--salt-file", str(salt))
    doc = json.loads(out)
    assert code == 0 and [s["port"] for s in doc["servers"]] == [8001, 8002, 8003]
    assert TEST_SALT not in out


def test_render_errors(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run(capsys, "render", "203.0.113.10", "--repo", str(EXAMPLE))
    assert code == 2 and "FLEETLLM_VLLM_API_SALT" in err
    monkeypatch.setenv("FLEETLLM_VLLM_API_SALT", TEST_SALT)
    code, _, err = run(capsys, "render", "10.1.1.1", "--repo", str(EXAMPLE))
    assert code == 1 and "'10.1.1.1' is not in the placement" in err
    code, _, err = run(capsys, "render", "198.51.100.23", "--repo", str(EXAMPLE))
    assert code == 1 and "legacy pair" in err and "FLEETLLM_LEGACY_API_KEY" in err
    monkeypatch.setenv("FLEETLLM_LEGACY_API_KEY", TEST_LEGACY_KEY)
    assert run(capsys, "render", "198.51.100.23", "--repo", str(EXAMPLE))[0] == 0


def test_render_refuses_an_invalid_fleet(capsys: pytest.CaptureFixture[str], fleet_dir: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETLLM_VLLM_API_SALT", TEST_SALT)
    break_placement(fleet_dir)
    code, _, err = run(capsys, "render", "203.0.113.10", "--repo", str(fleet_dir))
    assert code == 1 and "[port-not-listen]" in err


def test_api_key(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    salt, host, port, expected = GOLDEN[0]
    path = tmp_path / "salt"
    path.write_text(salt + "\n")
    code, out, _ = run(capsys, "api-key", "--host", host, "--port", str(port), "--salt-file", str(path))
    assert code == 0 and out.strip() == expected
    monkeypatch.setenv("FLEETLLM_VLLM_API_SALT", salt)
    assert run(capsys, "api-key", "--host", host, "--port", str(port))[1].strip() == expected
    with pytest.raises(SystemExit) as exit_info:
        main(["api-key", "--host", host, "--port", "70000"])
    assert exit_info.value.code == 2
    monkeypatch.delenv("FLEETLLM_VLLM_API_SALT")
    assert run(capsys, "api-key", "--host", host, "--port", "8001")[0] == 2


def test_api_key_with_a_short_salt_warns_and_gives_llmaos_bearer(capsys: pytest.CaptureFixture[str],
                                                                 tmp_path: Path) -> None:
    """A 12-character salt (an llmao fleet's) is accepted: the contract's bearer on stdout, a warning on
    stderr that names neither the salt nor the bearer."""
    salt = "twelve-chars"
    path = tmp_path / "salt"
    path.write_text(salt + "\n")
    code, out, err = run(capsys, "api-key", "--host", "::ffff:203.0.113.10", "--port", "8001", "--salt-file", str(path))
    message = b"llmao.vllm.api_key\n203.0.113.10\n8001"
    expected = "sk-vllm-" + base64.urlsafe_b64encode(
        hmac.new(salt.encode(), message, hashlib.sha256).digest()).rstrip(b"=").decode()
    assert code == 0 and out.strip() == expected
    assert "warning" in err and "shorter than 16" in err and salt not in err and expected not in err


def test_console_script_runs(tmp_path: Path) -> None:
    env = {**os.environ, "FLEETLLM_VLLM_API_SALT": TEST_SALT}
    result = subprocess.run([sys.executable, "-m", "fleetllm", "validate", str(EXAMPLE)], capture_output=True,
                            text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr


def test_api_key_of_a_legacy_pair_is_the_key_that_server_uses(capsys: pytest.CaptureFixture[str], fleet_dir: Path,
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # It used to print a derived bearer the legacy server does not use; --legacy-key-file did not exist.
    monkeypatch.setenv("FLEETLLM_VLLM_API_SALT", TEST_SALT)
    monkeypatch.delenv("FLEETLLM_LEGACY_API_KEY", raising=False)
    key_file = tmp_path / "legacy"
    key_file.write_text(TEST_LEGACY_KEY + "\n")
    legacy = ["api-key", "--host", "198.51.100.23", "--port", "8000", "--repo", str(fleet_dir)]
    code, out, _ = run(capsys, *legacy, "--legacy-key-file", str(key_file))
    assert (code, out.strip()) == (0, TEST_LEGACY_KEY)
    code, out, err = run(capsys, *legacy)
    assert code == 2 and out == ""
    assert ("198.51.100.23:8000 is a legacy pair (fleet.yaml legacy_servers): its bearer is the shared legacy key; "
            "pass --legacy-key-file FILE or set FLEETLLM_LEGACY_API_KEY") in err
    # Any other server of the fleet: the derived bearer; from inside the repository without --repo too.
    code, out, err = run(capsys, "api-key", "--host", "203.0.113.10", "--port", "8001", "--repo", str(fleet_dir))
    assert (code, out.strip(), err) == (0, GOLDEN[0][3], "")
    monkeypatch.chdir(fleet_dir)
    assert run(capsys, "api-key", "--host", "198.51.100.23", "--port", "8000",
               "--legacy-key-file", str(key_file))[1].strip() == TEST_LEGACY_KEY
    # Outside any repository: the derived bearer, and a note that a legacy pair would differ.
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "api-key", "--host", "203.0.113.10", "--port", "8001")
    assert (code, out.strip()) == (0, GOLDEN[0][3])
    assert "a legacy pair cannot be told apart" in err
