"""Where to look while the demo runs: URLs, files and commands that work as printed (no secret on a
command line: curl reads its Authorization header from a 0600 file in the scratch directory)."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

from fleetllm.demo.litellm import Litellm
from fleetllm.demo.workspace import Workspace


def fleetllm_command() -> str:
    """`fleetllm` as this shell can run it: the script beside this Python (a venv need not be active)."""
    beside = Path(sys.executable).parent / "fleetllm"
    if beside.exists() and shutil.which("fleetllm") != str(beside):
        return shlex.quote(str(beside))
    return "fleetllm"


def chat_curl(litellm: Litellm, header_file: Path, model: str, text: str = "Hello from the fleetllm demo") -> str:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": text}]})
    return (f"curl -sS {litellm.url}/v1/chat/completions -H @{shlex.quote(str(header_file))} "
            f"-H 'Content-Type: application/json' -d {shlex.quote(body)}")


def banner(boxes: int, plane_url: str, litellm: Litellm | None) -> list[str]:
    """The live display's header: what runs, where, and how to stop it."""
    target = f"LiteLLM {litellm.url}" if litellm is not None else "no LiteLLM: the boxes route"
    return [f"fleetllm demo: {boxes} simulated boxes (no GPU)   status page {plane_url}/   {target}   Ctrl-C stops"]


def where_to_look(workspace: Workspace, plane_url: str, litellm: Litellm | None, model: str) -> list[str]:
    fleetllm = fleetllm_command()
    box_logs = workspace.boxes / "<address>" / "data" / "fleetllm" / "logs"
    lines = [
        "",
        "Where to look",
        f"  status page      {plane_url}/   (sign in with the token in {workspace.secret_file('admin-token')})",
        f"  control plane    {plane_url}/health   (log: {workspace.control_plane / 'serve.log'})",
        f"  reconciler       the passes of `{fleetllm} reconcile`, run by the demo   "
        f"(log: {workspace.control_plane / 'reconcile.log'})",
        f"  box reports      curl -sS -H @{workspace.secret_file('admin-auth.header')} {plane_url}/admin/reports",
        f"  fleet repository {workspace.fleet}   (edit placement.yaml, commit: the control plane serves it)",
        f"  what a commit does  {fleetllm} diff HEAD~1 HEAD --repo {workspace.fleet}",
        f"  simulated boxes  {workspace.boxes}/<address>/   (vLLM logs: {box_logs})",
        f"  config           {workspace.config}   (the control plane's and the reconciler's)",
        f"  fleet controls   {fleetllm} sync|suspend|resume|pin REV|unpin|control --url {plane_url} "
        f"--token-file {workspace.secret_file('admin-token')}",
    ]
    if litellm is not None:
        lines += [
            f"  LiteLLM          {litellm.url}",
            f"  the plan, by hand  {fleetllm} plan --config {workspace.config}",
            "  a chat completion through LiteLLM to a simulated box:",
            f"    {chat_curl(litellm, workspace.secret_file('litellm-auth.header'), model)}",
        ]
    else:
        lines += [
            "  LiteLLM          none: the boxes route, commits roll out without it. `make demo-litellm` (or "
            "FLEETLLM_DEMO_LITELLM=1) builds one",
            f"  the verdicts, by hand  {fleetllm} plan --config {workspace.config}   (no LiteLLM: it judges every "
            "server and says it cannot show a LiteLLM plan)",
        ]
    lines.append("")
    return lines
