"""The LiteLLM proxy the demo converges: one that is given (`--litellm-url` and its master key), or
one it builds for the run with ../shared/litellm-offline, as CI does (a real LiteLLM with PostgreSQL,
on free loopback ports, stopped and removed with the scratch directory).

A given proxy is shared with whoever else uses it, so the demo touches only its own deployments: it
refuses to start when the proxy holds fleetllm deployments of boxes that are not the demo's (its
prune would delete them), and deletes its own when it stops (their boxes are gone).
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

import fleetllm
from fleetllm.adapters.litellm import LitellmClient
from fleetllm.core.judge.observed import Deployment
from fleetllm.core.secret import Secret
from fleetllm.demo import procs
from fleetllm.demo.fleet import DemoError
from fleetllm.demo.workspace import Workspace

BUILD_TIMEOUT_S = 900
START_TIMEOUT_S = 300


@dataclass
class Litellm:
    url: str
    master_key: str = field(repr=False)
    prefix: Path | None = None  # set when the demo built it (and so stops it)
    tag: str = ""  # procs.TAG of the processes it runs, when built

    def _client(self, session: aiohttp.ClientSession) -> LitellmClient:
        return LitellmClient(session, self.url, Secret(self.master_key, "the demo's LiteLLM master key"), timeout_s=30)

    def deployments(self) -> tuple[Deployment, ...]:
        async def work() -> tuple[Deployment, ...]:
            async with aiohttp.ClientSession() as session:
                return await self._client(session).list_deployments()
        return asyncio.run(work())

    def delete(self, ids: Collection[str]) -> None:
        async def work() -> None:
            async with aiohttp.ClientSession() as session:
                client = self._client(session)
                for ident in ids:
                    await client.delete(ident)
        asyncio.run(work())

    def chat(self, model: str, text: str, max_tokens: int | None = None) -> str:
        """One chat completion through the proxy; the answer's text."""
        request_body: dict[str, object] = {"model": model, "messages": [{"role": "user", "content": text}]}
        if max_tokens is not None:  # a real vLLM with random weights rarely ends on its own
            request_body["max_tokens"] = max_tokens
        body = json.dumps(request_body).encode()
        request = urllib.request.Request(self.url.rstrip("/") + "/v1/chat/completions", data=body, method="POST",  # noqa: S310
                                         headers={"Authorization": f"Bearer {self.master_key}",
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 (the proxy's own URL)
                answer = json.loads(response.read())
        except (OSError, ValueError) as exc:
            detail = exc.read().decode(errors="replace")[:300] if isinstance(exc, urllib.error.HTTPError) else exc
            raise DemoError(f"chat completion for {model} through LiteLLM failed: {detail}") from None
        return str(answer["choices"][0]["message"]["content"])

    def stop(self) -> None:
        if self.prefix is not None and (self.prefix / "stop-all.sh").exists():
            procs.run([str(self.prefix / "stop-all.sh")], env=_env(), log=self.prefix / "stop.log", tag=self.tag,
                      timeout_s=120)


def find_harness() -> Path | None:
    """../shared/litellm-offline beside the project, as .ci/run uses it; else beside a folder further up
    (a git worktree sits deeper than the main checkout)."""
    project = Path(fleetllm.__file__).resolve().parents[1]
    for folder in project.parents:
        if (folder / "shared" / "litellm-offline" / "setup.sh").is_file():
            return folder / "shared" / "litellm-offline"
    return None


def _env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8"}


def demo_owned(deployment: Deployment, boxes: Collection[str]) -> bool:
    key = deployment.recorded_key
    return key is not None and key[0] in boxes


def check_shared(litellm: Litellm, boxes: Collection[str]) -> None:
    """Refuse a proxy whose fleetllm deployments belong to another fleet."""
    try:
        rows = litellm.deployments()
    except Exception as exc:  # any failure to list is a reason not to go on
        raise DemoError(f"cannot list the deployments of LiteLLM at {litellm.url}: {exc}") from None
    others = sorted(d.id for d in rows if d.managed and not demo_owned(d, boxes))
    if others:
        raise DemoError(f"LiteLLM at {litellm.url} has fleetllm deployments of another fleet ({', '.join(others[:5])}"
                        f"{', ...' if len(others) > 5 else ''}); the demo's reconciler would delete them. "
                        "Use a LiteLLM of its own (or FLEETLLM_DEMO_LITELLM=1 to build one)")


def remove_demo_deployments(litellm: Litellm, boxes: Collection[str]) -> int:
    ours = [d.id for d in litellm.deployments() if d.managed and demo_owned(d, boxes)]
    litellm.delete(ours)
    return len(ours)


def build(workspace: Workspace, harness: Path, master_key: str, say: Callable[[str], None]) -> Litellm:
    """setup.sh (about 90 s: PostgreSQL, LiteLLM in a venv, migrations), then the proxy (about 25 s)."""
    setup = harness / "setup.sh"
    if not setup.is_file():
        raise DemoError(f"no LiteLLM harness at {harness} (setup.sh): pass --litellm-harness DIR, or --litellm-url")
    if os.geteuid() != 0:
        raise DemoError("building LiteLLM with the offline harness needs root (it installs and runs PostgreSQL); "
                        "run as root, or give a running proxy with --litellm-url")
    prefix = workspace.litellm
    prefix.mkdir()
    log = workspace.root / "litellm-build.log"
    litellm = Litellm("", master_key, prefix, workspace.tag)
    try:
        _build(litellm, setup, log, say)
    except BaseException:  # a failure or Ctrl-C half-way: PostgreSQL or the proxy may be up already
        litellm.stop()
        raise
    return litellm


def _build(litellm: Litellm, setup: Path, log: Path, say: Callable[[str], None]) -> None:
    prefix = litellm.prefix
    assert prefix is not None
    say(f"building a LiteLLM proxy with PostgreSQL in {prefix} (about 90 s; log: {log})")
    code = procs.run(["bash", str(setup), str(prefix)], env={**_env(), "PGPORT": str(procs.free_port())}, log=log,
                     tag=litellm.tag, timeout_s=BUILD_TIMEOUT_S)
    if code != 0:
        raise DemoError(f"the LiteLLM harness failed (exit {code}); see {log}:\n{procs.tail(log)}")
    run_dir = prefix / "demo"  # stop-all.sh finds proxies at PREFIX/*/proxy.pid
    run_dir.mkdir()
    config = run_dir / "config.yaml"
    descriptor = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(f"model_list: []\ngeneral_settings:\n  master_key: {litellm.master_key}\n")
    port = procs.free_port()
    litellm.url = f"http://127.0.0.1:{port}"
    say(f"starting the LiteLLM proxy on {litellm.url} (about 25 s)")
    code = procs.run(["bash", "-c", 'source "$1/env.sh" && exec "$1/start-proxy.sh" "$2" "$3"', "start-proxy",
                      str(prefix), str(config), str(port)], env=_env(), log=log, tag=litellm.tag,
                     timeout_s=START_TIMEOUT_S)
    if code != 0:
        raise DemoError(f"the LiteLLM proxy did not start; see {run_dir / 'proxy.log'}:\n"
                        + procs.tail(run_dir / "proxy.log"))
