"""The box JSON: what `GET /vllm/config` answers and `fleetllm render` prints.

The shape is the box contract's, one entry per vLLM process, optional keys present only when the
recipe sets them, `port` always the listen port. Additive fields: `revision` (the commit) and a
per-server `digest` of its boot-lifetime fields, which the box reports back so the reconciler can
tell a server running stale config. A box with a gateway also gets per-server `listen_host` and a
top-level `gateway` (fleetllm.core.fleet.boxgateway). A box whose rollout mode is auto gets
`agent: {"poll_s": N}` (the installer then runs the box agent); a manual box's JSON has no `agent` key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from fleetllm.core.fleet.bearer import Salt, bearer_fingerprint
from fleetllm.core.fleet.boxgateway import LOOPBACK, gateway_section
from fleetllm.core.fleet.flags import render_settings
from fleetllm.core.fleet.jsonvalue import JSON, canonical_json
from fleetllm.core.fleet.model import Box, Fleet, Recipe, RolloutMode, ServerRow
from fleetllm.errors import OperationError

OPTIONAL_FIELDS = ("gpu_memory_utilization", "max_model_len", "vram_gb", "disk_gb", "kv_bytes_per_token")


class RenderError(OperationError):
    """The box cannot be rendered (unknown box, legacy pair without the legacy key)."""


@dataclass(frozen=True)
class Bearers:
    """Where bearers come from: the salt, and the shared key for legacy pairs (may be absent)."""

    salt: Salt
    legacy_key: str | None = None
    previous_salt: Salt | None = None  # a salt rotation in progress: what not yet restarted servers run on

    def previous_for(self, fleet: Fleet, box: str, port: int) -> str | None:
        """The previous salt's bearer for a server (None without one, or for a legacy pair)."""
        if self.previous_salt is None or fleet.settings.is_legacy(box, port):
            return None
        return self.previous_salt.derive(box, port)

    def for_server(self, fleet: Fleet, box: str, row: ServerRow) -> str:
        if fleet.settings.is_legacy(box, row.port):
            if not self.legacy_key:
                raise RenderError(f"server {row.name} on {box}:{row.port} is a legacy pair and uses the shared "
                                  "legacy key: pass --legacy-key-file or set FLEETLLM_LEGACY_API_KEY")
            return self.legacy_key
        return self.salt.derive(box, row.port)


def vllm_args(recipe: Recipe) -> list[str]:
    """The recipe's extra `vllm serve` arguments: its args, then its rendered settings."""
    return [*recipe.vllm.args, *render_settings(recipe.vllm.settings)]


def _number(value: float | int) -> JSON:
    """Keep integers integral in the JSON (18, not 18.0)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def boot_digest(entry: dict[str, JSON]) -> str:
    """Digest of a server's boot-lifetime fields. The bearer enters only as its fingerprint."""
    boot = {k: v for k, v in entry.items() if k not in ("api_key", "digest")}
    boot["api_key_fingerprint"] = bearer_fingerprint(str(entry["api_key"]))
    return "sha256:" + hashlib.sha256(canonical_json(boot).encode()).hexdigest()


def server_entry(fleet: Fleet, box: Box, row: ServerRow, bearer: str) -> dict[str, JSON]:
    recipe = fleet.recipes[row.model]
    vllm = recipe.vllm
    entry: dict[str, JSON] = {
        "name": row.name,
        "model": vllm.model,
        "served_model_name": vllm.served_model_name,
        "host": box.name,
        "port": row.port,
    }
    if box.gateway_port is not None:
        entry["listen_host"] = LOOPBACK  # behind the gateway: reachable from the box only
    entry["api_key"] = bearer
    entry["args"] = list(vllm_args(recipe))
    for field in OPTIONAL_FIELDS:
        value = getattr(vllm, field)
        if value is not None:
            entry[field] = _number(value)
    entry["digest"] = boot_digest(entry)
    return entry


def render_box(fleet: Fleet, box_name: str, bearers: Bearers) -> dict[str, JSON]:
    box = fleet.box(box_name)
    if box is None:
        raise RenderError(f"box {box_name!r} is not in the placement at revision {fleet.revision}")
    servers = [server_entry(fleet, box, row, bearers.for_server(fleet, box.name, row)) for row in box.servers]
    entries: list[JSON] = list(servers)
    document: dict[str, JSON] = {"host": box.name, "revision": fleet.revision, "servers": entries}
    if box.gateway_port is not None:
        document["gateway"] = gateway_section(box.gateway_port, bearers.salt.derive(box.name, box.gateway_port),
                                              servers)
    agent = agent_section(fleet, box.name)
    if agent is not None:
        document["agent"] = agent
    document["report_key"] = bearers.salt.report_key(box.name)  # POST /vllm/report for this box only
    return document


def agent_section(fleet: Fleet, box_name: str) -> dict[str, JSON] | None:
    """The box JSON's `agent` key: present only for a box whose rollout mode is auto."""
    if fleet.rollout_mode(box_name) is not RolloutMode.AUTO:
        return None
    return {"poll_s": fleet.settings.rollout.poll_s}


def render_all(fleet: Fleet, bearers: Bearers,
               on_error: Callable[[str, RenderError], None] | None = None) -> dict[str, dict[str, JSON]]:
    """Every box's JSON, keyed by box name. A box that cannot render is reported and left out."""
    rendered: dict[str, dict[str, JSON]] = {}
    for name in fleet.boxes:
        try:
            rendered[name] = render_box(fleet, name, bearers)
        except RenderError as exc:
            if on_error is None:
                raise
            on_error(name, exc)
    return rendered
