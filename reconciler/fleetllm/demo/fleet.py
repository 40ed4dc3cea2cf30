"""The demo's fleet: the example repository rewritten to run on one machine. Pure functions over the
files' text and the validated model.

- Every box is renamed to a loopback address (127.0.0.2, 127.0.0.3, ... in placement order), so each
  simulated box has its own address and the real listen ports.
- `vast` and `runpod` boxes become `provider: static`: there is no provider API to list them, and the
  reconciler dials a static box at its name (now its address) and listen port. Which provisioning
  script boots the box (vast.sh or runpod.sh) still follows the example's provider.
- A legacy pair follows its box to the new address (the demo sets a legacy key).
- A row that pins a hand-written public port is dropped: nothing maps public ports here.
- Staged rollouts go faster than on rented boxes: the box agents poll every DEMO_POLL_S seconds and a
  drained deployment waits DEMO_DRAIN_S seconds (fleet.yaml `rollout: {poll_s: 5, drain_s: 3}`), so a
  rollout scenario takes tens of seconds, not minutes.

Every other line, comment and value stays as the example wrote it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from fleetllm.core.fleet import strictyaml
from fleetllm.core.fleet.diagnostics import format_text
from fleetllm.core.fleet.files import FLEET_FILE, PLACEMENT_FILE, WORKTREE_REVISION, Snapshot
from fleetllm.core.fleet.model import Box, Fleet, Provider
from fleetllm.core.fleet.validate import validate_snapshot
from fleetllm.errors import OperationError

DEFAULT_FIRST_ADDRESS = "127.0.0.2"  # 127.0.0.1 is the control plane's
DEFAULT_GPU_MEMORY_GB = 80.0  # a simulated box whose placement declares no GPU memory: one 80 GB card
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
DEMO_POLL_S = 5  # fleet.yaml rollout.poll_s in the demo (the schema's minimum)
DEMO_DRAIN_S = 3  # fleet.yaml rollout.drain_s in the demo: the stub answers within milliseconds


class DemoError(OperationError):
    """The demo cannot run as asked; the message says why and what to do."""


class Template(StrEnum):
    """How a box boots: which provisioning script of installer/provision/ runs on it."""

    VAST = "vast"  # supervisord already runs (Vast's image); vast.sh runs the installer, which updates it
    RUNPOD = "runpod"  # runpod.sh runs the installer, then becomes supervisord (the pod's main process)


@dataclass(frozen=True)
class SimBox:
    name: str  # the box's name in the demo placement: its loopback address
    example_name: str  # its name in fleet-repo-example
    template: Template
    gpus: int
    gpu_memory_gb: float  # all GPUs together, what its simulated nvidia-smi reports
    real_vllm: bool = False  # runs the real vLLM CPU harness instead of the stub (fleetllm demo --real-vllm)
    address: str = ""  # where its servers listen when its name is not an address (a rented pod): "" is `name`
    provider_id: str = ""  # RUNPOD_POD_ID or PUBLIC_IPADDR, when not its name (a rented pod): "" is `name`
    env: tuple[tuple[str, str], ...] = ()  # more of its environment (a rented pod's, from the provider)

    @property
    def listen(self) -> str:
        """The loopback address its servers listen on."""
        return self.address or self.name

    @property
    def nvidia_smi_gpus(self) -> str:
        """FAKE_NVIDIA_SMI_GPUS for this box: "NAME:TOTAL_MIB:FREE_MIB" per card, joined by ";"."""
        mib = int(self.gpu_memory_gb * 1024 / self.gpus)
        return ";".join([f"Simulated GPU {self.gpu_memory_gb / self.gpus:g}GB (no GPU here):{mib}:{mib}"] * self.gpus)


@dataclass(frozen=True)
class DemoFleet:
    files: Mapping[str, bytes]
    fleet: Fleet  # the files, validated
    boxes: tuple[SimBox, ...]
    dropped: tuple[str, ...]  # what was left out, and why


def addresses(first: str, count: int) -> list[str]:
    """`count` consecutive loopback addresses from `first`; never 127.0.0.1 (the control plane's)."""
    try:
        start = ipaddress.IPv4Address(first)
    except ValueError:
        raise DemoError(f"{first!r} is not an IPv4 address such as 127.0.0.2") from None
    made = [start + i for i in range(count)] if int(start) + count - 1 <= int(LOOPBACK.broadcast_address) else []
    if not made or not all(a in LOOPBACK and a != ipaddress.IPv4Address("127.0.0.1") for a in made):
        raise DemoError(f"{count} simulated boxes from {first} would leave 127.0.0.0/8 or take 127.0.0.1; "
                        "pick another first address, e.g. 127.0.0.2 or 127.1.0.2")
    return [str(a) for a in made]


def sim_box(box: Box, name: str) -> SimBox:
    """The simulated box for `box`, at address `name`: booted like its provider's boxes, with the GPUs its
    placement declares (else one 80 GB card)."""
    template = Template.RUNPOD if box.provider is Provider.RUNPOD else Template.VAST
    return SimBox(name, box.name, template, box.gpus or 1, box.gpu_memory_gb or DEFAULT_GPU_MEMORY_GB)


@dataclass(frozen=True)
class _Replace:
    line: int  # 1-based
    column: int  # 1-based start of the scalar as written (its opening quote, if quoted)
    old: str
    new: str


def _apply(text: str, replaces: list[_Replace], drop_lines: set[int], header: list[str]) -> str:
    lines = text.split("\n")
    for r in sorted(replaces, key=lambda r: (r.line, -r.column)):
        line, start = lines[r.line - 1], r.column - 1
        written = next((w for w in (r.old, f"'{r.old}'", f'"{r.old}"') if line.startswith(w, start)), None)
        if written is None:
            raise DemoError(f"line {r.line}: cannot find {r.old!r} where the YAML parser put it")
        lines[r.line - 1] = line[:start] + r.new + line[start + len(written):]
    lines = [line for number, line in enumerate(lines, start=1) if number not in drop_lines]
    at = 1 if lines and lines[0].startswith("# yaml-language-server:") else 0
    return "\n".join([*lines[:at], *header, *lines[at:]])


def _row_path(doc: strictyaml.Document, box: str, index: int) -> list[str | int]:
    hosts = doc.value.get("hosts") if isinstance(doc.value, dict) else None
    detailed = isinstance(hosts, dict) and isinstance(hosts.get(box), dict)
    return ["hosts", box, "servers", index] if detailed else ["hosts", box, index]


def simulate(example: Snapshot, first_address: str = DEFAULT_FIRST_ADDRESS) -> DemoFleet:
    """The example rewritten for loopback boxes, validated. Raises DemoError."""
    validation = validate_snapshot(example)
    if validation.fleet is None:
        raise DemoError("the example fleet is not valid:\n" + format_text(validation.diagnostics))
    fleet = validation.fleet
    names = dict(zip(fleet.boxes, addresses(first_address, len(fleet.boxes)), strict=True))
    placement = _text(example, PLACEMENT_FILE)
    doc = strictyaml.load(placement, PLACEMENT_FILE)
    replaces, drop, dropped = [], set(), []
    for old, new in names.items():
        mark = doc.key_mark(["hosts"], old)
        replaces.append(_Replace(mark.line, mark.column, old, new))
        box = fleet.boxes[old]
        if box.provider in (Provider.VAST, Provider.RUNPOD):
            mark = doc.mark_at(["hosts", old, "provider"])
            replaces.append(_Replace(mark.line, mark.column, str(box.provider), str(Provider.STATIC)))
        for index, row in enumerate(box.servers):
            if row.public_port is not None:
                drop.add(doc.mark_at(_row_path(doc, old, index)).line)
                dropped.append(f"{old}:{row.port} {row.model}: pins public port {row.public_port}, which nothing "
                               "maps on loopback")
    header = ["#", "# fleetllm demo: the boxes of fleet-repo-example, each simulated on its own loopback address",
              "# (no GPU here; vLLM is the stub). Vast and RunPod boxes are `provider: static` (no provider API):",
              *[f"#   {old} -> {new}" for old, new in names.items()]]
    files = {**{k: v for k, v in example.files.items() if isinstance(v, bytes)},
             PLACEMENT_FILE: _apply(placement, replaces, drop, header).encode(),
             FLEET_FILE: _fast_rollout(_legacy_renamed(_text(example, FLEET_FILE), fleet, names)).encode()}
    result = validate_snapshot(Snapshot(WORKTREE_REVISION, files, {name: name for name in files}))
    if result.fleet is None:
        raise DemoError("the example fleet rewritten for loopback boxes is not valid:\n"
                        + format_text(result.diagnostics))
    boxes = tuple(sim_box(b, names[b.name]) for b in fleet.boxes.values())
    _check_binds(result.fleet)
    return DemoFleet(files, result.fleet, boxes, tuple(dropped))


def _legacy_renamed(text: str, fleet: Fleet, names: Mapping[str, str]) -> str:
    doc = strictyaml.load(text, FLEET_FILE)
    pairs = doc.value.get("legacy_servers") if isinstance(doc.value, dict) else None
    replaces = []
    for index, pair in enumerate(pairs if isinstance(pairs, list) else []):
        host = pair.get("host") if isinstance(pair, dict) else None
        if isinstance(host, str) and host in names:
            mark = doc.mark_at(["legacy_servers", index, "host"])
            replaces.append(_Replace(mark.line, mark.column, host, names[host]))
    return _apply(text, replaces, set(), []) if replaces else text


def _fast_rollout(text: str) -> str:
    """fleet.yaml with the demo's agent poll and drain (DEMO_POLL_S, DEMO_DRAIN_S): the values replaced
    where the file sets them, else added to its `rollout:` mapping, else a `rollout:` mapping appended."""
    doc = strictyaml.load(text, FLEET_FILE)
    rollout = doc.value.get("rollout") if isinstance(doc.value, dict) else None
    wanted = {"poll_s": DEMO_POLL_S, "drain_s": DEMO_DRAIN_S}
    if not isinstance(rollout, dict):
        return text.rstrip("\n") + "\n\n# fleetllm demo: a fast agent poll and drain\nrollout:\n" + "".join(
            f"  {key}: {value}\n" for key, value in wanted.items())
    replaces, missing = [], []
    for key, value in wanted.items():
        if key in rollout:
            mark = doc.mark_at(["rollout", key])
            replaces.append(_Replace(mark.line, mark.column, str(rollout[key]), str(value)))
        else:
            missing.append(f"{key}: {value}")
    edited = _apply(text, replaces, set(), [])
    if not missing:
        return edited
    lines = edited.split("\n")
    at = doc.key_mark([], "rollout").line  # the `rollout:` line; its entries follow
    first = doc.mark_at(["rollout", next(iter(rollout))]) if rollout else None
    indent = " " * (first.column - 1) if first is not None else "  "
    lines[at:at] = [f"{indent}{entry}  # fleetllm demo" for entry in missing]
    return "\n".join(lines)


def _text(snapshot: Snapshot, name: str) -> str:
    content = snapshot.files.get(name)
    return content.decode("utf-8") if isinstance(content, bytes) else ""


def binds(fleet: Fleet) -> list[tuple[str, int]]:
    """Every (address, port) a process of the fleet listens on: a server on its box's address, or on
    127.0.0.1 behind its box's gateway, which listens on the box's address."""
    found: list[tuple[str, int]] = []
    for box in fleet.boxes.values():
        behind = box.gateway_port is not None
        found.extend(("127.0.0.1" if behind else box.name, row.port) for row in box.servers)
        if box.gateway_port is not None:
            found.append((box.name, box.gateway_port))
    return found


def _check_binds(fleet: Fleet) -> None:
    seen: set[tuple[str, int]] = set()
    for bind in binds(fleet):
        if bind in seen:
            raise DemoError(f"two simulated servers would both listen on {bind[0]}:{bind[1]} (servers behind box "
                            "gateways share 127.0.0.1 here); give their rows different ports")
        seen.add(bind)


REAL_MODELS = ("tiny-real-a", "tiny-real-b")


def with_real_box(demo: DemoFleet, model_path: str, first_address: str, *, max_model_len: int,
                  kv_cache_bytes: int, max_num_seqs: int) -> DemoFleet:
    """The demo fleet plus one box of two real vLLM servers (the harness's tiny Llama) on the next loopback
    address, on one simulated card (so the second waits for the first), with the CPU flags in the
    recipes' `settings` as a fleet repository would carry them."""
    address = addresses(first_address, len(demo.boxes) + 1)[-1]
    ports = demo.fleet.settings.listen_ports[:2]
    if len(ports) < 2:
        raise DemoError("the example fleet lists fewer than two listen_ports: the real vLLM box needs two")
    recipe = (f"    description: the real vLLM (CPU build) serving a tiny random Llama (fleetllm demo --real-vllm)\n"
              f"    health_grace_s: 900\n"
              f"    vllm:\n      model: {model_path}\n      max_model_len: {max_model_len}\n      vram_gb: 1\n"
              f"      disk_gb: 0\n      settings:\n        kv-cache-memory-bytes: {kv_cache_bytes}\n"
              f"        max-num-seqs: {max_num_seqs}\n")
    models = _bytes_text(demo.files, "models.yaml").rstrip("\n") + "\n\n" + "".join(
        f"  {name}:\n{recipe}" for name in REAL_MODELS)
    rows = "".join(f"      - [{name}, {port}]\n" for name, port in zip(REAL_MODELS, ports, strict=True))
    placement = (_bytes_text(demo.files, PLACEMENT_FILE).rstrip("\n")
                 + f"\n\n  # fleetllm demo --real-vllm: two real vLLM servers on one (simulated) card\n"
                 f"  {address}:\n    provider: static\n    servers:\n{rows}")
    files = {**demo.files, "models.yaml": models.encode(), PLACEMENT_FILE: placement.encode()}
    result = validate_snapshot(Snapshot(WORKTREE_REVISION, files, {name: name for name in files}))
    if result.fleet is None:
        raise DemoError("the demo fleet with the real vLLM box is not valid:\n" + format_text(result.diagnostics))
    _check_binds(result.fleet)
    real = SimBox(address, "real vLLM box", Template.VAST, 1, DEFAULT_GPU_MEMORY_GB, real_vllm=True)
    return DemoFleet(files, result.fleet, (*demo.boxes, real), demo.dropped)


def _bytes_text(files: Mapping[str, bytes], name: str) -> str:
    content = files.get(name)
    return content.decode("utf-8") if isinstance(content, bytes) else ""
