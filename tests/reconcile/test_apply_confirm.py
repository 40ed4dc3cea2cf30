"""`fleetllm apply` asks first, like `terraform apply`: on a terminal it shows the plan and applies it
only after `yes` (exactly the plan shown); `--yes` applies without asking; without a terminal on stdin
it refuses unless `--yes`. Real parts: a fleet git repository, `fleetllm apply` processes (on a pseudo-
terminal where a person would answer), a stub vLLM process, LiteLLM's model API (the in-memory fake)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetllm.core.fleet.bearer import Salt
from tests.conftest import git
from tests.reconcile.fakes import FakeLitellmHttp, free_port
from tests.reconcile.procs import Stub
from tests.reconcile.test_loop_real import ROOT, SALT, commit, write_fleet
from tests.support.write_killer import ThreadedServer

BOX = "127.0.0.2"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[FakeLitellmHttp, Path, dict[str, str], str]]:
    port = free_port(BOX)
    repo = tmp_path / "fleet"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_fleet(repo, [port], {BOX: [("tiny-a", port)]})
    commit(repo, "one box")
    fake = FakeLitellmHttp(master_key="sk-confirm-master-0123")
    stub = Stub(BOX, port, "org/tiny-a", "tiny-a", Salt(SALT).derive(BOX, port))
    try:
        with ThreadedServer(fake.app()) as server:
            config = tmp_path / "control-plane.yaml"
            config.write_text(f"litellm: {{url: '{server.url}', master_key: '${{env:T_MK}}'}}\n"
                              "secrets: {vllm_api_salt: '${env:T_SALT}'}\n"
                              f"repo: {{path: '{repo}', branch: main}}\n"
                              f"state: {{url: 'sqlite:///{tmp_path}/state.db'}}\n")
            yield fake, config, {**os.environ, "T_MK": fake.master_key, "T_SALT": SALT}, f"fleetllm:{BOX}:{port}"
    finally:
        stub.kill()


def apply(config: Path, env: dict[str, str], *args: str, answer: str | None = None) -> tuple[int, str]:
    """`fleetllm apply`; with `answer`, on a pseudo-terminal that types it (else stdin is /dev/null)."""
    command = [sys.executable, "-m", "fleetllm", "apply", "--config", str(config), *args]
    if answer is None:
        done = subprocess.run(command, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=120, check=False)
        return done.returncode, done.stdout + done.stderr
    primary, terminal = pty.openpty()
    try:
        os.write(primary, answer.encode() + b"\n")  # the terminal keeps the line until the prompt reads it
        done = subprocess.run(command, env=env, cwd=ROOT, stdin=terminal, capture_output=True, text=True,
                              timeout=120, check=False)
    finally:
        os.close(terminal)
        os.close(primary)
    return done.returncode, done.stdout + done.stderr


def test_without_a_terminal_it_refuses_unless_yes(world: tuple[FakeLitellmHttp, Path, dict[str, str], str]) -> None:
    fake, config, env, ident = world
    code, out = apply(config, env)
    assert code == 2, out
    assert "refusing to apply without confirmation: stdin is not a terminal" in out and "--yes" in out
    assert "Traceback" not in out
    assert fake.rows == {}
    code, out = apply(config, env, "--yes")
    assert code == 0, out
    assert "Do you want to perform these actions?" not in out
    assert list(fake.rows) == [ident]


def test_on_a_terminal_it_shows_the_plan_and_asks(world: tuple[FakeLitellmHttp, Path, dict[str, str], str]) -> None:
    fake, config, env, ident = world
    code, out = apply(config, env, answer="no")
    assert code == 1, out
    assert f"+ deployment {ident}" in out and "Plan: 1 to add, 0 to change, 0 to destroy." in out
    assert out.index("Plan: 1 to add") < out.index("Do you want to perform these actions?")
    assert "Apply cancelled: nothing was written." in out
    assert fake.rows == {}
    code, out = apply(config, env, answer="yes")
    assert code == 0, out
    assert list(fake.rows) == [ident]
    assert f"ok     create  {ident}" in out
    assert out.count("Plan: 1 to add") == 1  # shown once, before the question
    code, out = apply(config, env, answer="")  # nothing to do: nothing asked
    assert code == 0, out
    assert "No changes." in out and "Do you want" not in out
