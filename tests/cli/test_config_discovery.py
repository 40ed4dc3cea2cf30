"""Where a command finds the control plane's config file without --config (fleetllm.cli.common.find_config):
$FLEETLLM_CONFIG, then ./fleetllm.yaml, then $XDG_CONFIG_HOME/fleetllm/config.yaml (~/.config/... without
it), then /etc/fleetllm/config.yaml; --config wins; a FLEETLLM_CONFIG naming no file is an error naming the
variable; nothing found keeps each command's fallback. Through the real commands: serve --check, approve,
plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetllm.cli import common
from fleetllm.cli.common import CONFIG_ENV, find_config
from fleetllm.cli.main import main
from fleetllm.errors import ConfigurationError
from tests.conftest import git
from tests.server.conftest import ENV, base_config, write_config


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Every default place, in a scratch tree: the working directory, XDG_CONFIG_HOME, HOME, /etc."""
    found = {"cwd": tmp_path / "work" / "fleetllm.yaml", "xdg": tmp_path / "xdg" / "fleetllm" / "config.yaml",
             "home": tmp_path / "home" / ".config" / "fleetllm" / "config.yaml",
             "etc": tmp_path / "etc" / "fleetllm" / "config.yaml", "env": tmp_path / "elsewhere" / "cp.yaml"}
    for path in found.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(found["cwd"].parent)
    monkeypatch.setattr(common, "SYSTEM_CONFIG", found["etc"])
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return found


def env(places: dict[str, Path], **extra: str) -> dict[str, str]:
    return {"HOME": str(places["home"].parents[2]), **extra}


def test_the_order_of_the_places(places: dict[str, Path]) -> None:
    xdg = {"XDG_CONFIG_HOME": str(places["xdg"].parents[1])}
    assert find_config(None, env(places, **xdg)) is None
    places["etc"].write_text("x")
    assert find_config(None, env(places, **xdg)) == str(places["etc"])
    places["home"].write_text("x")
    assert find_config(None, env(places, **xdg)) == str(places["etc"])  # XDG_CONFIG_HOME set: not ~/.config
    assert find_config(None, env(places)) == str(places["home"])  # unset: ~/.config
    assert find_config(None, env(places, XDG_CONFIG_HOME="relative/dir")) == str(places["home"])  # ignored
    places["xdg"].write_text("x")
    assert find_config(None, env(places, **xdg)) == str(places["xdg"])
    places["cwd"].write_text("x")
    assert Path(find_config(None, env(places, **xdg)) or "").resolve() == places["cwd"].resolve()
    places["env"].write_text("x")
    assert find_config(None, env(places, **xdg, **{CONFIG_ENV: str(places["env"])})) == str(places["env"])
    assert find_config("given.yaml", env(places, **{CONFIG_ENV: str(places["env"])})) == "given.yaml"  # --config


def test_a_variable_naming_no_file_is_an_error_naming_it(places: dict[str, Path]) -> None:
    places["cwd"].write_text("x")  # not taken instead: the variable asked for another file
    for named in (str(places["env"]), str(places["env"].parent)):  # missing, a directory
        with pytest.raises(ConfigurationError, match=f"^{CONFIG_ENV}={named}: no such file; point {CONFIG_ENV}"):
            find_config(None, env(places, **{CONFIG_ENV: named}))
    assert find_config(None, env(places, **{CONFIG_ENV: ""})) is not None  # empty: unset


def test_the_log_says_which_file_and_why(places: dict[str, Path], fleet_git: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    write_config(places["cwd"], base_config(fleet_git, places["cwd"].parent / "state.db"))
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FLEETLLM_LOG_LEVEL", "info")
    assert main(["approve", "203.0.113.77", "qwen3-8b"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    found = [line for line in lines if line["event"] == "config file"]
    assert [(line["level"], line["found_by"]) for line in found] == [("info", "./fleetllm.yaml in the current "
                                                                                 "directory")]
    assert Path(found[0]["path"]).resolve() == places["cwd"].resolve()


def test_serve_check_finds_its_config_through_the_variable_and_the_places(
        places: dict[str, Path], fleet_git: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    assert main(["serve", "--check"]) == 2  # nothing anywhere: says where it looked
    err = capsys.readouterr().err
    assert "fleetllm serve: no config file: pass --config FILE" in err and "/etc/fleetllm/config.yaml" in err
    write_config(places["env"], base_config(fleet_git, places["env"].parent / "state.db"))
    monkeypatch.setenv(CONFIG_ENV, str(places["env"]))
    assert main(["serve", "--check"]) == 0
    assert "ok: would serve" in capsys.readouterr().out
    monkeypatch.setenv(CONFIG_ENV, str(places["env"]) + ".missing")
    assert main(["serve", "--check"]) == 1
    assert f"fleetllm serve: {CONFIG_ENV}={places['env']}.missing: no such file" in capsys.readouterr().err
    monkeypatch.delenv(CONFIG_ENV)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(places["xdg"].parents[1]))
    write_config(places["xdg"], base_config(fleet_git, places["xdg"].parent / "state.db"))
    assert main(["serve", "--check"]) == 0
    bad = {**base_config(fleet_git, places["xdg"].parent / "state.db"), "no_such_key": 1}
    assert main(["serve", "--check", "--config", str(write_config(places["env"], bad))]) == 1  # --config wins
    assert "no_such_key" in capsys.readouterr().err


def test_approve_takes_the_repository_of_a_found_config_unless_given_one(
        places: dict[str, Path], fleet_git: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    write_config(places["etc"], base_config(fleet_git, tmp_path / "state.db"))
    assert main(["approve", "203.0.113.78", "qwen3-8b"]) == 0  # run outside the repository: /etc's repo.path
    assert "approve/203.0.113.78" in git(fleet_git, "branch", "--list", "approve/*")
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", str(fleet_git), str(other))
    assert main(["approve", "203.0.113.79", "qwen3-8b", "--repo", str(other)]) == 0  # --repo: the config unused
    assert "approve/203.0.113.79" in git(other, "branch", "--list", "approve/*")
    assert "approve/203.0.113.79" not in git(fleet_git, "branch", "--list", "approve/*")


def test_plan_without_any_config_keeps_the_environment_fallback(
        places: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("LITELLM_URL", "LITELLM_MASTER_KEY", "FLEETLLM_VLLM_API_SALT"):
        monkeypatch.delenv(name, raising=False)
    assert main(["plan"]) == 1
    err = capsys.readouterr().err
    assert "fleetllm plan: no config file given or found" in err and "LITELLM_URL" in err
    monkeypatch.setenv(CONFIG_ENV, str(places["env"]))
    assert main(["plan"]) == 1  # a pass that could not run: exit 1, naming the variable
    assert f"fleetllm plan: {CONFIG_ENV}={places['env']}: no such file" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["serve", "plan", "apply", "reconcile", "approve"])
def test_the_help_of_each_command_with_a_config_says_where_it_looks(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "$FLEETLLM_CONFIG, else the first file found of ./fleetllm.yaml, $XDG_CONFIG_HOME/fleetllm/config.yaml " \
           "(~/.config/fleetllm/config.yaml) and /etc/fleetllm/config.yaml" in text
