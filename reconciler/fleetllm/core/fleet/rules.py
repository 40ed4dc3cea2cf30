"""Semantic rules: what JSON Schema cannot say about a fleet. Each rule has a stable id.

| rule id                 | what it catches                                                        |
|-------------------------|------------------------------------------------------------------------|
| unknown-model           | a placement row names a model the catalog does not have               |
| port-not-listen         | a port outside the listen ports (and not a declared legacy pair)       |
| too-many-servers        | more servers on a box than max_servers_per_box                         |
| duplicate-port          | two servers on one box with the same listen port                       |
| duplicate-name          | two servers on one box with the same process name                      |
| unsafe-name             | a process name unusable as a file or Supervisor program name           |
| box-name                | a box name that is neither an IP address nor a provider id / DNS name  |
| vram-exceeds            | summed vram_gb above the box's declared GPU memory                     |
| disk-exceeds            | summed disk_gb above the box's declared disk                           |
| gpu-memory-overcommit   | explicit gpu_memory_utilization values on one card summing above 1    |
| max-model-len           | context promised beyond max_model_len, or a KV cache that cannot fit   |
| managed-flag            | args/settings setting a flag fleetllm manages (--port, --api-ke=, ...) |
| unsafe-arg              | control/non-ASCII characters in an argument (the unit file refuses them)|
| option-not-allowed      | an option that runs code or reads files on the box (--trust-remote-code, |
|                         | --chat-template, plugins, --config, ...) without vllm.allow_options     |
| unknown-allowed-option  | an allow_options entry that is not such an option (a typo allows nothing)|
| reserved-route-field    | litellm fields fleetllm sets itself (api_base, api_key, model_info.id) |
| empty-placement         | no box at all, without allow_empty_placement: true                     |
| public-port-deprecated  | (warning) a hand-written public port as a row's 4th element            |
| legacy-unused           | (warning) a legacy pair that no row uses                               |
| gateway-not-listen      | a box gateway's port outside the listen ports                          |
| gateway-port-reused     | a server row on the gateway's own port                                 |
| gateway-backend-port    | a port below 1024 for a server behind a gateway (loopback ports)       |
| gateway-legacy          | a legacy pair on a gateway box (its shared key cannot sit behind it)   |
| gateway-duplicate-model | two servers of one served model name behind one gateway                |
| gateway-reserved-name   | a process named `gateway` on a gateway box (the gateway's program)     |
| gateway-no-servers      | a gateway on a box without servers (it would have nothing to route)   |
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator

from fleetllm.core.fleet.build import Built, Finding
from fleetllm.core.fleet.files import FLEET_FILE, MODELS_FILE, PLACEMENT_FILE
from fleetllm.core.fleet.flags import managed_tokens, render_settings
from fleetllm.core.fleet.model import Box, Provider, Recipe
from fleetllm.core.fleet.options import RISKY_OPTIONS, risky_tokens
from fleetllm_contract import vllmflags
from fleetllm_contract.boxjson import GATEWAY_PROGRAM, unsafe_token

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_DNS_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
PROVIDER_ID = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*")
RESERVED_PARAMS = ("api_base", "api_key")
RESERVED_INFO = ("id", "managed_by", "fleetllm")
MAX_CONTEXT = 16_777_216
GIB = 1024**3
MIN_BACKEND_PORT = 1024


def box_name_problem(name: str, provider: Provider | None) -> str | None:
    """Why `name` cannot name a box, or None when it can."""
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        address = None
    if address is not None:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            return f"write the IPv4 address {address.ipv4_mapped} instead of the mapped form {name}"
        if str(address) != name:
            return f"write the address in its canonical form {address}"
        return None
    if re.fullmatch(r"[0-9]+(?:\.[0-9]*)+", name):
        return f"{name!r} looks like an IPv4 address but is not a valid one"
    if provider is Provider.VAST:
        return "a Vast box is named by its public IP address (PUBLIC_IPADDR)"
    if len(name) > 253 or not PROVIDER_ID.fullmatch(name):
        return (f"{name!r} is neither an IP address nor a provider id or DNS name "
                "(lowercase letters, digits, '-' and '.')")
    return None


def _row_at(built: Built, box: str, index: int, element: int) -> tuple[str | int, ...]:
    """The path of one element of a box's index-th built row (rows a schema error skipped do not count)."""
    return (*built.row_paths[(box, index)], element)


def check_boxes(built: Built) -> Iterator[Finding]:
    settings = built.settings
    for box in built.boxes.values():
        where = ("hosts",)
        problem = box_name_problem(box.name, box.provider)
        if problem:
            yield Finding(PLACEMENT_FILE, where, problem, "box-name", key=box.name)
        if len(box.servers) > settings.max_servers_per_box:
            yield Finding(PLACEMENT_FILE, where, f"box {box.name} has {len(box.servers)} servers; at most "
                          f"{settings.max_servers_per_box} are allowed (max_servers_per_box)",
                          "too-many-servers", key=box.name)
        yield from _check_rows(built, box)
        if box.gateway_port is not None:
            yield from _check_gateway(built, box, box.gateway_port)
        yield from _check_capacity(built, box)


def _check_rows(built: Built, box: Box) -> Iterator[Finding]:
    settings = built.settings
    ports: dict[int, str] = {}
    names: dict[str, int] = {}
    for i, row in enumerate(box.servers):
        if row.model not in built.recipes and row.model not in built.broken_recipes:
            yield Finding(PLACEMENT_FILE, _row_at(built, box.name, i, 0),
                          f"unknown model {row.model!r}: not in {MODELS_FILE}", "unknown-model")
        legacy = settings.is_legacy(box.name, row.port)
        if box.gateway_port is None and row.port not in settings.listen_ports and not legacy:
            allowed = ", ".join(str(p) for p in settings.listen_ports)
            yield Finding(PLACEMENT_FILE, _row_at(built, box.name, i, 1),
                          f"port {row.port} is not a listen port ({allowed}) nor a declared legacy pair",
                          "port-not-listen")
        if row.port in ports:
            yield Finding(PLACEMENT_FILE, _row_at(built, box.name, i, 1),
                          f"port {row.port} is already used on {box.name} by {ports[row.port]!r}",
                          "duplicate-port")
        ports.setdefault(row.port, row.name)
        name_element = 2 if row.name != row.model else 0
        if row.name in names:
            yield Finding(PLACEMENT_FILE, _row_at(built, box.name, i, name_element),
                          f"process name {row.name!r} is already used on {box.name} (row {names[row.name] + 1});"
                          " give one row a third element to tell them apart", "duplicate-name")
        names.setdefault(row.name, i)
        if not SAFE_NAME.fullmatch(row.name):
            yield Finding(PLACEMENT_FILE, _row_at(built, box.name, i, name_element),
                          f"process name {row.name!r} is not usable as a file and Supervisor program name: "
                          "1-64 of letters, digits, '_', '.', '-', starting with a letter or digit",
                          "unsafe-name")
        if row.public_port is not None:
            yield Finding(PLACEMENT_FILE, _row_at(built, box.name, i, 3),
                          "a hand-written public port is deprecated: the provider's listing maps listen "
                          "ports to public ports; remove the 4th element", "public-port-deprecated",
                          warning=True)


def _check_gateway(built: Built, box: Box, gateway: int) -> Iterator[Finding]:
    """A gateway box: the gateway takes the listen port, the rows become loopback backends behind it."""
    settings = built.settings
    if gateway not in settings.listen_ports:
        allowed = ", ".join(str(p) for p in settings.listen_ports)
        yield Finding(PLACEMENT_FILE, ("hosts", box.name), f"gateway port {gateway} is not a listen port ({allowed})",
                      "gateway-not-listen", key="gateway")
    if not box.servers:
        yield Finding(PLACEMENT_FILE, ("hosts", box.name), f"box {box.name} has a gateway but no server for it to "
                      "route to; remove `gateway:` or place a server", "gateway-no-servers", key="gateway")
    served: dict[str, str] = {}
    for i, row in enumerate(box.servers):
        port_at = _row_at(built, box.name, i, 1)
        if settings.is_legacy(box.name, row.port):
            yield Finding(PLACEMENT_FILE, port_at, f"{box.name}:{row.port} is a legacy pair (shared legacy key, "
                          "public port) and cannot sit behind the box gateway; move it to a box without "
                          "`gateway:` or retire the pair", "gateway-legacy")
        elif row.port == gateway:
            yield Finding(PLACEMENT_FILE, port_at, f"port {row.port} is the gateway's port on {box.name}; give "
                          "the server another port (behind the gateway any free port from "
                          f"{MIN_BACKEND_PORT} works)", "gateway-port-reused")
        elif row.port < MIN_BACKEND_PORT:
            yield Finding(PLACEMENT_FILE, port_at, f"port {row.port} is below {MIN_BACKEND_PORT}: a server behind "
                          "the gateway listens on a loopback port, any free port from "
                          f"{MIN_BACKEND_PORT} to 65535", "gateway-backend-port")
        name_element = 2 if row.name != row.model else 0
        if row.name == GATEWAY_PROGRAM:
            yield Finding(PLACEMENT_FILE, _row_at(built, box.name, i, name_element), f"process name "
                          f"{GATEWAY_PROGRAM!r} is the box gateway's own (its Supervisor program and log file); "
                          "give the row another third element", "gateway-reserved-name")
        recipe = built.recipes.get(row.model)
        if recipe is None:
            continue
        name = recipe.vllm.served_model_name
        if name in served:
            yield Finding(PLACEMENT_FILE, _row_at(built, box.name, i, 0), f"served model name {name!r} is already "
                          f"behind the gateway of {box.name} (server {served[name]!r}); the gateway routes each "
                          "name to one server, so place the second one on another box", "gateway-duplicate-model")
        served.setdefault(name, row.name)


def _check_capacity(built: Built, box: Box) -> Iterator[Finding]:
    recipes = [built.recipes[r.model] for r in box.servers if r.model in built.recipes]
    where = ("hosts", box.name)
    vram = sum(r.vllm.vram_gb or 0 for r in recipes)
    disk = sum(r.vllm.disk_gb or 0 for r in recipes)
    if box.gpu_memory_gb is not None and vram > box.gpu_memory_gb:
        parts = " + ".join(f"{r.name} {r.vllm.vram_gb:g}" for r in recipes if r.vllm.vram_gb)
        yield Finding(PLACEMENT_FILE, where, f"the servers' weights need {vram:g} GB of GPU memory ({parts}) "
                      f"but the box declares {box.gpu_memory_gb:g} GB", "vram-exceeds", key="gpu_memory_gb")
    if box.disk_gb is not None and disk > box.disk_gb:
        yield Finding(PLACEMENT_FILE, where, f"the servers' weights need {disk:g} GB of disk but the box "
                      f"declares {box.disk_gb:g} GB", "disk-exceeds", key="disk_gb")
    fractions = [r.vllm.gpu_memory_utilization for r in recipes if r.vllm.gpu_memory_utilization]
    if (box.gpus or 1) == 1 and sum(fractions) > 1.0:
        yield Finding(PLACEMENT_FILE, ("hosts",), f"explicit gpu_memory_utilization values on {box.name} add up "
                      f"to {sum(fractions):.2f} of one card", "gpu-memory-overcommit", key=box.name)
    if box.gpu_memory_gb is not None and box.gpu_memory_gb > vram:  # else vram-exceeds says it, once
        free_gib = (box.gpu_memory_gb - vram)
        for recipe in {r.name: r for r in recipes}.values():  # two servers of one model: one message
            kv, length = recipe.vllm.kv_bytes_per_token, recipe.vllm.max_model_len
            if kv and length and kv * length / GIB > free_gib:
                yield Finding(PLACEMENT_FILE, where, f"{recipe.name}: one {length}-token sequence needs "
                              f"{kv * length / GIB:.1f} GB of KV cache but only {free_gib:g} GB is left on "
                              f"{box.name} after all weights", "max-model-len", key="gpu_memory_gb")


def check_recipes(built: Built) -> Iterator[Finding]:
    for recipe in built.recipes.values():
        yield from _check_recipe(recipe)


def _check_recipe(recipe: Recipe) -> Iterator[Finding]:
    base = ("models", recipe.name)
    vllm = recipe.vllm
    for index, token, flag in managed_tokens(vllm.args):
        yield Finding(MODELS_FILE, (*base, "vllm", "args"), f"args[{index}]: "
                      f"{vllmflags.explain(token, flag)}", "managed-flag")
    for key, value in vllm.settings.items():
        tokens = render_settings({key: value})
        for _, token, flag in managed_tokens(tokens):
            rendered_as = "" if token == tokens[0] else f" (in its value {vllmflags.spelling(token)!r})"
            yield Finding(MODELS_FILE, (*base, "vllm", "settings"), f"settings key {key!r} renders "
                          f"{tokens[0]}{rendered_as}: {vllmflags.explain(token, flag)}", "managed-flag", key=key)
    rendered = render_settings(vllm.settings)
    yield from _check_options(recipe, rendered)
    for token in (*vllm.args, *rendered):
        problem = unsafe_token(token)
        if problem:
            yield Finding(MODELS_FILE, (*base, "vllm"), f"argument {token[:80]!r} {problem}; the box's Supervisor "
                          "program could not carry it", "unsafe-arg")
    context = recipe.litellm.model_info.get("context_window")
    if (vllm.max_model_len is not None and isinstance(context, int) and not isinstance(context, bool)
            and context > vllm.max_model_len):
        yield Finding(MODELS_FILE, (*base, "litellm", "model_info"), f"context_window {context} promises "
                      f"callers more than max_model_len {vllm.max_model_len} serves", "max-model-len",
                      key="context_window")
    for key in RESERVED_PARAMS:
        if key in recipe.litellm.params:
            yield Finding(MODELS_FILE, (*base, "litellm", "params"), f"{key} is set by fleetllm for each "
                          "server; remove it", "reserved-route-field", key=key)
    for key in recipe.litellm.model_info:
        if key in RESERVED_INFO or key.startswith("fleetllm"):
            yield Finding(MODELS_FILE, (*base, "litellm", "model_info"), f"model_info.{key} is set by "
                          "fleetllm (ownership and provenance); remove it", "reserved-route-field", key=key)


def _check_options(recipe: Recipe, rendered: tuple[str, ...]) -> Iterator[Finding]:
    """Options that run code or read files on the box need the recipe's explicit allow."""
    base = ("models", recipe.name, "vllm")
    allowed = recipe.vllm.allow_options
    for where, argv in (("args", recipe.vllm.args), ("settings", rendered)):
        for index, token, option in risky_tokens(argv):
            if option in allowed:
                continue
            spelled = "" if vllmflags.spelling(token) == f"--{option}" else f" (read by vLLM as --{option})"
            at = f"args[{index}]" if where == "args" else "a settings key"
            yield Finding(MODELS_FILE, (*base, where), f"{at}: {vllmflags.spelling(token)}{spelled} "
                          f"{RISKY_OPTIONS[option]}; if that is intended, add {option!r} to this recipe's "
                          "vllm.allow_options (the pull-request comment then lists it at its top)",
                          "option-not-allowed")
    for option in sorted(allowed - set(RISKY_OPTIONS)):
        yield Finding(MODELS_FILE, (*base, "allow_options"), f"{option!r} is not an option that needs an allow "
                      "(see fleetllm.core.fleet.options); remove it or fix its spelling", "unknown-allowed-option")


def check_fleet(built: Built, placement_empty: bool) -> Iterator[Finding]:
    if placement_empty and not built.settings.allow_empty_placement:
        yield Finding(PLACEMENT_FILE, (), "the placement has no box: every deployment would be removed. If "
                      f"that is intended, set allow_empty_placement: true in {FLEET_FILE}", "empty-placement")
    placed = {(box.name, row.port) for box in built.boxes.values() for row in box.servers}
    for host, port in sorted(built.settings.legacy_servers - placed):
        yield Finding(FLEET_FILE, ("legacy_servers",), f"legacy pair {host}:{port} is declared but no "
                      "placement row uses it", "legacy-unused", warning=True)


def check(built: Built, placement_empty: bool) -> list[Finding]:
    return [*check_fleet(built, placement_empty), *check_recipes(built), *check_boxes(built)]
