"""`fleetllm import llmao --check`: every server's bearer, as fleetllm renders it, equals llmao's.

llmao's side is either the box JSON llmao serves (GET /vllm/config with the fleet key and
X-LLMAO-Host, one request per box), or llmao's derivation computed here from the box contract's
formula with llmao's salt. The comparison is pure; no bearer is ever printed, only ok or which
field differs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fleetllm.core.fleet.jsonvalue import JSON
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.fleet.render import Bearers, RenderError, render_box

CONTRACT_DOMAIN = "llmao.vllm.api_key"


def llmao_bearer(salt: str, host: str, port: int) -> str:
    """llmao's derivation, as the box contract writes it (salt stripped of surrounding whitespace,
    host with ::ffff: stripped, port in decimal)."""
    host = host.strip()
    if host.lower().startswith("::ffff:") and "." in host:
        host = host[len("::ffff:"):]
    message = f"{CONTRACT_DOMAIN}\n{host}\n{port}".encode()
    digest = hmac.new(salt.strip().encode("utf-8"), message, hashlib.sha256).digest()
    return "sk-vllm-" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


@dataclass(frozen=True)
class Line:
    box: str
    server: str  # name:port
    ok: bool
    detail: str = ""

    def text(self) -> str:
        mark = "ok      " if self.ok else "MISMATCH"
        return f"  {mark} {self.box} {self.server}" + (f": {self.detail}" if self.detail else "")


BoxSource = Callable[[str], Mapping[str, JSON] | str]  # box -> llmao's box JSON, or why it is not available


def computed_source(fleet: Fleet, salt: str, legacy_key: str | None,
                    legacy: frozenset[tuple[str, int]]) -> BoxSource:
    """llmao's box JSON as far as bearers go: one entry per row, the contract's derivation or the
    shared key for a legacy pair."""
    def source(box: str) -> Mapping[str, JSON] | str:
        found = fleet.box(box)
        if found is None:
            return "not in the imported placement"
        servers: list[JSON] = []
        for row in found.servers:
            if (box, row.port) in legacy:
                if not legacy_key:
                    return f"{row.name}:{row.port} is a legacy pair and no shared key was given"
                key = legacy_key
            else:
                key = llmao_bearer(salt, box, row.port)
            servers.append({"name": row.name, "port": row.port, "api_key": key})
        return {"host": box, "servers": servers}
    return source


def compare_box(box: str, ours: Mapping[str, JSON], theirs: Mapping[str, JSON]) -> list[Line]:
    """Pure: server by server (matched by listen port), the bearer and the fields llmao serves."""
    def by_port(doc: Mapping[str, JSON]) -> dict[int, dict[str, JSON]]:
        servers = doc.get("servers")
        out: dict[int, dict[str, JSON]] = {}
        for s in servers if isinstance(servers, list) else []:
            if isinstance(s, dict) and isinstance(s.get("port"), int):
                out[int(s["port"])] = s  # type: ignore[arg-type]
        return out

    mine, llmao = by_port(ours), by_port(theirs)
    lines: list[Line] = []
    for port in sorted(set(mine) | set(llmao)):
        a, b = mine.get(port), llmao.get(port)
        label = f"{(a or b or {}).get('name')}:{port}"
        if a is None:
            lines.append(Line(box, label, False, "llmao serves it, the import does not"))
            continue
        if b is None:
            lines.append(Line(box, label, False, "the import has it, llmao does not serve it"))
            continue
        fields = ("name", "model", "served_model_name", "max_model_len", "vram_gb", "disk_gb",
                  "gpu_memory_utilization")
        differs: list[str] = [f for f in fields if f in b and a.get(f) != b.get(f)]
        if "args" in b and isinstance(b["args"], list) and isinstance(a.get("args"), list):
            theirs_args = [x for x in b["args"] if isinstance(x, str)]
            if not _same_args(a["args"], theirs_args, a):  # type: ignore[arg-type]
                differs.append("args")
        bearer_ok = hmac.compare_digest(str(a.get("api_key", "")), str(b.get("api_key", "")))
        if not bearer_ok:
            differs.insert(0, "bearer")
        lines.append(Line(box, label, not differs, ("differs: " + ", ".join(differs)) if differs else "same bearer"))
    return lines


def _same_args(ours: list[str], theirs: list[str], entry: Mapping[str, JSON]) -> bool:
    """llmao's args may carry the flags fleetllm moved into fields (--served-model-name ...)."""
    if ours == theirs:
        return True
    rest: list[str] = []
    skip = False
    for i, token in enumerate(theirs):
        if skip:
            skip = False
            continue
        name = token[2:].split("=", 1)[0] if token.startswith("--") else None
        if name in ("served-model-name", "max-model-len", "gpu-memory-utilization"):
            skip = "=" not in token and i + 1 < len(theirs)
            continue
        rest.append(token)
    return rest == ours


def check_fleet(fleet: Fleet, bearers: Bearers, source: BoxSource) -> list[Line]:
    lines: list[Line] = []
    for box in sorted(fleet.boxes):
        try:
            ours = render_box(fleet, box, bearers)
        except RenderError as exc:
            lines.append(Line(box, "*", False, f"fleetllm cannot render it: {exc}"))
            continue
        theirs = source(box)
        if isinstance(theirs, str):
            lines.append(Line(box, "*", False, theirs))
            continue
        lines.extend(compare_box(box, ours, theirs))
    return lines
