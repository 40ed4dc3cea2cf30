"""The placement edit that approving a box makes, pure: rows for its models on the first free listen
ports (`assign_rows`), placement.yaml's text with the box added (`add_box`: a round-trip YAML edit with
ruamel.yaml that keeps every comment and every other line as written), and the branch a new approval
goes on (`ref_name`). fleetllm.adapters.approve validates the edited fleet and commits it.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError

from fleetllm.core.fleet.files import PLACEMENT_FILE
from fleetllm.core.fleet.model import Fleet, Provider
from fleetllm.errors import OperationError

_INDENTS = [(m, s, o) for m in (2, 4) for s in (2, 4, 6) for o in (0, 2, 4) if o <= s - 2]


class ApproveError(OperationError):
    """The approval cannot be made; the message says why and what to do."""


@dataclass(frozen=True)
class Row:
    model: str
    port: int
    name: str

    def yaml(self) -> list[str | int]:
        return [self.model, self.port] if self.name == self.model else [self.model, self.port, self.name]


def assign_rows(fleet: Fleet, host: str, models: Sequence[str]) -> tuple[Row, ...]:
    """One row per model on the first free listen ports; a repeated model gets a numbered name."""
    if not models:
        raise ApproveError("name at least one model to run on the box")
    unknown = sorted({m for m in models if m not in fleet.recipes})
    if unknown:
        raise ApproveError(f"unknown model{'s' * (len(unknown) > 1)} {', '.join(unknown)}; the catalog has "
                           f"{', '.join(sorted(fleet.recipes))}")
    if host in fleet.boxes:
        raise ApproveError(f"box {host} is already in the placement; edit {PLACEMENT_FILE} to change its servers")
    limit = min(len(fleet.settings.listen_ports), fleet.settings.max_servers_per_box)
    if len(models) > limit:
        raise ApproveError(f"{len(models)} models, but a box runs at most {limit} servers "
                           f"(listen ports {', '.join(map(str, fleet.settings.listen_ports))})")
    rows: list[Row] = []
    for model, port in zip(models, fleet.settings.listen_ports, strict=False):
        seen = sum(1 for r in rows if r.model == model)
        rows.append(Row(model, port, model if seen == 0 else f"{model}-{seen + 1}"))
    return tuple(rows)


def _yaml(mapping: int, sequence: int, offset: int) -> YAML:
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
    return yaml


def _round_trip(text: str) -> tuple[YAML, CommentedMap]:
    """The loader whose output reproduces `text` byte for byte (so the edit changes nothing else)."""
    for indent in _INDENTS:
        yaml = _yaml(*indent)
        try:
            data = yaml.load(text)
        except YAMLError as exc:
            raise ApproveError(f"{PLACEMENT_FILE} is not valid YAML: {exc}") from None
        out = io.StringIO()
        yaml.dump(data, out)
        if out.getvalue() == text:
            if not isinstance(data, CommentedMap) or not isinstance(data.get("hosts"), CommentedMap):
                raise ApproveError(f"{PLACEMENT_FILE} has no `hosts:` mapping to add the box to")
            return yaml, data
    raise ApproveError(f"cannot edit {PLACEMENT_FILE} without reformatting it (unusual indentation); add the box "
                       "by hand")


def add_box(placement: str, host: str, rows: Sequence[Row], note: str | None = None,
            provider: Provider | None = None) -> str:
    """placement.yaml's text with the box appended under `hosts:`, everything else unchanged. With a
    provider the box takes the detailed form (`provider:` and `servers:`), else the short row list."""
    yaml, data = _round_trip(placement)
    hosts: CommentedMap = data["hosts"]
    servers = CommentedSeq()
    for row in rows:
        item = CommentedSeq(row.yaml())
        item.fa.set_flow_style()
        servers.append(item)
    if provider is None:
        hosts[host] = servers
    else:
        box = CommentedMap()
        box["provider"] = provider.value
        box["servers"] = servers
        hosts[host] = box
    if note and not hosts.fa.flow_style():
        column = hosts.lc.key(next(iter(hosts)))[1] if len(hosts) > 1 else 2
        blank = "\n" if len(hosts) > 1 else ""
        hosts.yaml_set_comment_before_after_key(host, before=blank + note.replace("\n", " "), indent=column)
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def ref_name(host: str) -> str:
    """`approve/<host>` with the characters git forbids in ref names (IPv6 colons) replaced."""
    return "approve/" + re.sub(r"[^A-Za-z0-9._-]", "-", host).strip(".-")
