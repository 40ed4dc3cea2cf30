"""The gateway runs on uvloop when it is installed and on asyncio's own loop when it is not: uvloop is an
extra (`pip install 'fleetllm[gateway]'`), not a dependency, and a box's Python may lack it. The real
gateway process is started both ways and proxies a request; which loop it runs is read from the shared
objects mapped into its workers (/proc/PID/maps), not from its own word."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import pytest

from fleetllm_gateway.serve import serve_forever
from tests.gateway.conftest import ROOT, Upstreams, reference_config, running_gateway


def uvloop_mapped(pid: int) -> bool:
    return "/uvloop/" in Path(f"/proc/{pid}/maps").read_text()


def serving(pid: int) -> list[int]:
    """The processes that serve: the workers (the master's children), or the gateway itself alone."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(child) for child in children] or [pid]


def proxies(upstreams: Upstreams, env: dict[str, str] | None = None) -> bool:
    with running_gateway(reference_config(upstreams), env) as gateway:
        reply = gateway.request("POST", "/v1/chat/completions", body=b'{"model":"echo"}')
        assert reply.status == 200, reply
        assert gateway.proc is not None
        workers = serving(gateway.proc.pid)
        mapped = {uvloop_mapped(worker) for worker in workers}
        assert len(mapped) == 1, f"workers {workers} run different loops"
        return mapped.pop()


def test_without_uvloop_the_gateway_serves_on_asyncio(upstreams: Upstreams, tmp_path: Path) -> None:
    hidden = tmp_path / "hidden" / "uvloop"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text('raise ImportError("uvloop is not installed here (a test hides it)")\n')
    assert proxies(upstreams, {"PYTHONPATH": f"{hidden.parent}:{ROOT}"}) is False


@pytest.mark.integration  # uvloop is in the dev extra: CI has it, so this may not skip there
@pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed (the gateway extra)")
def test_with_uvloop_the_gateway_runs_on_it(upstreams: Upstreams) -> None:
    assert proxies(upstreams) is True  # what the test above would see if the fallback did not hold


def test_serve_forever_picks_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    async def loop_module() -> int:
        return 1 if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else 0

    monkeypatch.setitem(sys.modules, "uvloop", None)  # an import of it raises ImportError
    assert serve_forever(loop_module()) == 0
    if importlib.util.find_spec("uvloop") is not None:
        monkeypatch.delitem(sys.modules, "uvloop")
        assert serve_forever(loop_module()) == 1
