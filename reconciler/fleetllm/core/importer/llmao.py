"""llmao's files -> a fleet repository and a control-plane config. Pure: frozen data in, frozen data out.

llmao (the reference control plane fleetllm replaces) keeps placement in
`config.yaml` under `fleet:` and the catalog in `models.yaml`. `import_llmao` maps both to fleetllm's
three fleet files and a control-plane config whose secrets are references, and lists every field it
could not carry over (or had to change) with the reason: nothing is dropped silently.

Secret values never enter this module: the reader replaces them with `SECRET` before freezing, so the
mapping can only say that a secret was there, never what it was.

What keeps every bearer as it is (so no box restarts): box names are llmao's `fleet.hosts` keys with
`::ffff:` stripped (llmao's host normalisation), ports are the listen ports, the salt is the same value
(through a reference), and the pairs llmao keeps in LEGACY_SERVERS (a code constant, hence `legacy`)
become `legacy_servers` with `fleet.selfhost_api_key` as `secrets.legacy_api_key`.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from fleetllm.core.fleet.flags import flag_name
from fleetllm.core.fleet.jsonvalue import JSON, Frozen, freeze_mapping, thaw
from fleetllm.core.fleet.model import DEFAULT_LISTEN_PORTS
from fleetllm.errors import ConfigurationError
from fleetllm_contract.addresses import normalise_host

SECRET = "<secret>"  # noqa: S105 - a placeholder, not a password; what the reader leaves where llmao's files hold a secret value
SECRET_FIELDS = (("key",), ("vllm_api_salt",), ("selfhost_api_key",), ("vast", "api_key"))
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MODEL_PREFIXES = ("hosted_vllm/", "openai/")
IMPORTED_FLEET_ID = "llmao-import"  # fleet.yaml fleet_id of an imported fleet (a new fleet must have one)
RESERVED_INFO = ("id", "managed_by", "asf_api_base", "db_model")

# llmao's health knobs -> fleetllm's reconcile knobs (name, minimum the schema accepts, type)
HEALTH_KNOBS: Mapping[str, tuple[str, float, type]] = MappingProxyType({
    "health_interval_s": ("interval_s", 5, int),
    "health_timeout_s": ("probe_timeout_s", 0.001, float),
    "health_grace_s": ("health_grace_s", 0, int),
    "health_fail_threshold": ("down_after_failures", 1, int),
})
NOT_CARRIED: Mapping[str, str] = MappingProxyType({
    "skew_interval_s": "fleetllm has no separate skew pass: every reconcile pass (interval_s) compares LiteLLM "
                       "with the fleet and writes the difference",
    "litellm_health_interval_s": "fleetllm never calls LiteLLM's /health (it runs real completions and costs "
                                 "tokens); it probes each server's /v1/models with its bearer instead",
})
# vllm recipe fields carried as they are
VLLM_FIELDS = ("max_model_len", "gpu_memory_utilization", "vram_gb", "disk_gb", "kv_bytes_per_token")
# managed flags llmao recipes may carry in args, and the recipe field each moves to
FLAG_FIELDS = {"served-model-name": "served_model_name", "max-model-len": "max_model_len",
               "gpu-memory-utilization": "gpu_memory_utilization"}

ENV_FLEET_KEY, ENV_SALT = "FLEETLLM_FLEET_KEY", "FLEETLLM_VLLM_API_SALT"
ENV_LEGACY, ENV_VAST, ENV_LITELLM = "FLEETLLM_LEGACY_API_KEY", "VAST_API_KEY", "LITELLM_MASTER_KEY"
ENV_RUNPOD = "RUNPOD_API_KEY"


@dataclass(frozen=True)
class Dropped:
    """A field of llmao's files that was not carried over, or carried over changed."""

    where: str  # e.g. "config.yaml fleet.skew_interval_s"
    reason: str
    changed: bool = False  # True: carried over, but not as it was


@dataclass(frozen=True)
class EnvVar:
    """An environment variable (or credential) the operator must provide: its name and what to put in it."""

    name: str
    source: str  # where the value is in llmao's files, e.g. "config.yaml fleet.vllm_api_salt"
    why: str


@dataclass(frozen=True)
class Document:
    """One output file: its data and a provenance comment per path (a tuple of keys/indexes)."""

    data: Mapping[str, Frozen]
    comments: Mapping[tuple[str | int, ...], str] = field(default_factory=lambda: MappingProxyType({}))
    header: tuple[str, ...] = ()


@dataclass(frozen=True)
class Imported:
    fleet: Document
    models: Document
    placement: Document
    control_plane: Document
    dropped: tuple[Dropped, ...]
    env: tuple[EnvVar, ...]
    legacy: frozenset[tuple[str, int]]  # the legacy pairs, as box names and listen ports


class LlmaoImportError(ConfigurationError, ValueError):
    """llmao's files cannot be imported at all (no fleet section, no hosts...)."""


Comments = dict[tuple[str | int, ...], str]  # a provenance comment per path of one output file


@dataclass
class _Out:
    dropped: list[Dropped] = field(default_factory=list)

    def drop(self, where: str, reason: str, *, changed: bool = False) -> None:
        self.dropped.append(Dropped(where, reason, changed))


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _int(value: Frozen) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(value: Frozen) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class _Row:
    host: str  # llmao's key, as written
    box: str  # normalised: fleetllm's box name
    index: int
    model: str
    port: int
    name: str | None
    public_port: int | None


def _rows(hosts: Mapping[str, Frozen], out: _Out) -> list[_Row]:
    rows: list[_Row] = []
    seen_boxes: dict[str, str] = {}
    for host, value in hosts.items():
        box = normalise_host(str(host).strip())
        where = f"config.yaml fleet.hosts.{host}"
        if box in seen_boxes:
            out.drop(where, f"the same box as fleet.hosts.{seen_boxes[box]} once ::ffff: is stripped (llmao's host "
                            "normalisation); its rows are left out, merge them by hand")
            continue
        seen_boxes[box] = str(host)
        if box != host:
            out.drop(where, f"box named {box}: llmao strips ::ffff: and surrounding space, and so does the bearer "
                            "derivation", changed=True)
        if not isinstance(value, tuple):
            out.drop(where, "not a list of rows; left out")
            continue
        for i, raw in enumerate(value):
            at = f"{where}[{i}]"
            if not isinstance(raw, tuple) or not 2 <= len(raw) <= 4:
                out.drop(at, "not [model, port], [model, port, name] or [model, port, name|null, public_port]; "
                             "left out")
                continue
            model, port = raw[0], _int(raw[1])
            name = raw[2] if len(raw) > 2 else None
            public = _int(raw[3]) if len(raw) > 3 else None
            if not isinstance(model, str) or port is None or not 0 < port < 65536:
                out.drop(at, "needs a model name and a listen port; left out")
                continue
            if name is not None and not isinstance(name, str):
                out.drop(at, "the third element (process name) is not a string or null; left out")
                continue
            if len(raw) > 3 and (public is None or not 0 < public < 65536):
                out.drop(at, "the fourth element (public port) is not a port; left out")
                continue
            rows.append(_Row(str(host), box, i, model, port, name, public))
    return rows


def _served_name(entry: Mapping[str, Frozen], name: str) -> str | None:
    params = entry.get("litellm_params")
    model = params.get("model") if isinstance(params, Mapping) else None
    if isinstance(model, str):
        for prefix in MODEL_PREFIXES:
            if model.startswith(prefix):
                return model[len(prefix):] or None
    return None


def _split_flag(args: list[str], flag: str) -> tuple[list[str], str | None]:
    """Take `--flag VALUE` or `--flag=VALUE` out of args; returns the rest and the value."""
    rest: list[str] = []
    value: str | None = None
    skip = False
    for i, token in enumerate(args):
        if skip:
            skip = False
            continue
        if flag_name(token) == flag:
            if "=" in token:
                value = token.split("=", 1)[1]
            elif i + 1 < len(args):
                value, skip = args[i + 1], True
            continue
        rest.append(token)
    return rest, value


def _recipe(index: int, entry: Mapping[str, Frozen], out: _Out) -> tuple[str, dict[str, JSON], Comments] | None:
    """One catalog entry -> (model name, recipe, the comments to write beside it), or None when the entry
    cannot become a recipe (each reason in `out`). The steps: is it one of ours, its vLLM part, its
    LiteLLM part, then whatever the entry had that no step read."""
    usable = _usable(index, entry, out)
    if usable is None:
        return None
    name, where, info, vllm = usable
    comments: Comments = {(): f"from {where}", ("vllm",): "from model_info.vllm (boot lifetime)"}
    recipe_vllm, served = _recipe_vllm(where, entry, name, vllm, out)
    if "served_model_name" in recipe_vllm:
        comments[("vllm", "served_model_name")] = "litellm_params.model without hosted_vllm/ (what vLLM serves)"
    recipe: dict[str, JSON] = {"vllm": recipe_vllm}
    params = _litellm_params(where, entry.get("litellm_params"), served or name, out)
    model_info = _model_info(where, entry.get("pricing"), info, out)
    if isinstance(entry.get("pricing"), Mapping):
        comments[("litellm", "model_info")] = "the entry's pricing and its model_info without vllm"
    _fit_context_window(where, model_info, recipe_vllm, out)
    litellm: dict[str, JSON] = {}
    if params:
        litellm["params"] = params
    if model_info:
        litellm["model_info"] = model_info
    if litellm:
        recipe["litellm"] = litellm
        comments.setdefault(("litellm",), "from litellm_params and model_info (live lifetime)")
    for key in entry:
        if key not in ("model_name", "litellm_params", "model_info", "pricing"):
            out.drop(f"{where} {key}", "not part of a catalog entry fleetllm knows; left out")
    return name, recipe, comments


def _usable(index: int, entry: Mapping[str, Frozen], out: _Out
            ) -> tuple[str, str, Mapping[str, Frozen], Mapping[str, Frozen]] | None:
    """(name, where, model_info, model_info.vllm) of an entry fleetllm can manage: named, self-hosted, a
    name fleetllm allows, a Hugging Face id; None with the reason otherwise."""
    name = entry.get("model_name")
    where = f"models.yaml models[{index}]"
    if not isinstance(name, str):
        out.drop(where, "no model_name; left out")
        return None
    where = f"models.yaml models[{index}] ({name})"
    info = entry.get("model_info")
    info = info if isinstance(info, Mapping) else MappingProxyType({})
    if info.get("self_hosted") is not True:
        out.drop(where, "a commercial route (model_info.self_hosted is not true): fleetllm manages self-hosted "
                        "servers only; the deployment llmao posted stays in LiteLLM and fleetllm never touches it")
        return None
    if not NAME.match(name):
        out.drop(where, "the model name has characters fleetllm does not allow in a model name "
                        "(letters, digits, '.', '_', '-', at most 64); left out, with the rows that name it")
        return None
    vllm = info.get("vllm")
    if not isinstance(vllm, Mapping) or not isinstance(vllm.get("model"), str):
        out.drop(f"{where} model_info.vllm", "no model_info.vllm.model (the Hugging Face id); left out, with the "
                                             "rows that name it")
        return None
    return name, where, info, vllm


def _vllm_args(where: str, raw_args: Frozen | None, out: _Out) -> list[str] | None:
    """model_info.vllm.args as a list of words (a string is split shell-style), or None."""
    args: list[str] | str | None = None
    if isinstance(raw_args, tuple) and all(isinstance(a, str) for a in raw_args):
        args = [str(a) for a in raw_args]
    elif isinstance(raw_args, str):
        args = raw_args
    elif raw_args is not None:
        out.drop(f"{where} model_info.vllm.args", "neither a list of strings nor a string; left out")
    if isinstance(args, str):
        try:
            return shlex.split(args)
        except ValueError:
            out.drop(f"{where} model_info.vllm.args", "cannot be split shell-style; left out")
            return None
    return args


def _managed_flags(where: str, args: list[str], vllm: Mapping[str, Frozen], recipe_vllm: dict[str, JSON],
                   served: str | None, out: _Out) -> tuple[list[str], str | None]:
    """Take the flags fleetllm manages out of args: those a recipe field carries move to it (unless the
    recipe sets that field itself), those set for each server are left out. Returns (the other args, the
    served model name)."""
    for flag, target in FLAG_FIELDS.items():
        args, value = _split_flag(args, flag)
        if value is None:
            continue
        if target == "served_model_name":
            served = value
        elif target in vllm:
            out.drop(f"{where} model_info.vllm.args --{flag}", f"fleetllm manages --{flag}; the recipe's own "
                                                               f"vllm.{target} is used", changed=True)
            continue
        else:
            number: JSON = int(value) if value.isdigit() else _float_or_str(value)
            recipe_vllm[target] = number
        out.drop(f"{where} model_info.vllm.args --{flag}", f"fleetllm manages --{flag}; carried over as "
                                                           f"vllm.{target}", changed=True)
    for flag in ("port", "host", "api-key", "uds"):
        args, value = _split_flag(args, flag)
        if value is not None:
            out.drop(f"{where} model_info.vllm.args --{flag}", "set by fleetllm (and llmao) for each server; "
                                                               "left out")
    return args, served


def _recipe_vllm(where: str, entry: Mapping[str, Frozen], name: str, vllm: Mapping[str, Frozen],
                 out: _Out) -> tuple[dict[str, JSON], str | None]:
    """The recipe's vllm section and the name vLLM serves the model as."""
    recipe_vllm: dict[str, JSON] = {"model": str(vllm["model"])}
    args = _vllm_args(where, vllm.get("args"), out)
    served = _served_name(entry, name)
    if args is not None:
        args, served = _managed_flags(where, args, vllm, recipe_vllm, served, out)
    if served is not None and served != name:
        recipe_vllm["served_model_name"] = served
    if args:
        recipe_vllm["args"] = list[JSON](args)
    for key in VLLM_FIELDS:
        if key in vllm and vllm[key] is not None:
            recipe_vllm[key] = thaw(vllm[key])
    for key in vllm:
        if key == "source":
            out.drop(f"{where} model_info.vllm.source", "fleetllm takes the weights from vllm.model (a Hugging Face "
                                                        "id or an absolute path on the box); llmao's installer "
                                                        "did not use source either")
        elif key not in ("model", "args", *VLLM_FIELDS):
            out.drop(f"{where} model_info.vllm.{key}", "not a field of a fleetllm recipe; left out")
    return recipe_vllm, served


def _litellm_params(where: str, params_in: Frozen | None, served: str, out: _Out) -> dict[str, JSON]:
    """litellm_params without what fleetllm sets for each server, the default model and literal secrets."""
    params: dict[str, JSON] = {}
    if not isinstance(params_in, Mapping):
        return params
    for key, param in params_in.items():
        if key == "model":
            if param != f"hosted_vllm/{served}":
                params[key] = thaw(param)
        elif key in ("api_base", "api_key"):
            out.drop(f"{where} litellm_params.{key}", "set by fleetllm for each server; left out")
        elif (secret := secret_param(key, param)) is not None:
            out.drop(f"{where} litellm_params.{secret}", "holds a secret, which never goes into the fleet "
                     "repository; left out: give LiteLLM the value in its environment and write "
                     "`os.environ/NAME` for it in models.yaml litellm.params")
            kept = without_secrets(param) if isinstance(param, Mapping) else None
            if kept:
                params[key] = kept
        else:
            params[key] = thaw(param)
    return params


def _model_info(where: str, pricing: Frozen | None, info: Mapping[str, Frozen], out: _Out) -> dict[str, JSON]:
    """The entry's pricing and model_info, without vllm and what LiteLLM or fleetllm set per deployment."""
    model_info: dict[str, JSON] = {}
    if isinstance(pricing, Mapping):
        model_info.update({k: thaw(v) for k, v in pricing.items()})
    for key, extra in info.items():
        if key == "vllm":
            continue
        if key in RESERVED_INFO or key.startswith("fleetllm"):
            out.drop(f"{where} model_info.{key}", "set by LiteLLM or fleetllm for each deployment; left out")
            continue
        model_info[key] = thaw(extra)
    return model_info


def _fit_context_window(where: str, model_info: dict[str, JSON], recipe_vllm: Mapping[str, JSON],
                        out: _Out) -> None:
    """A context_window larger than max_model_len promises callers more than the server serves: lower it."""
    context = model_info.get("context_window")
    max_len = recipe_vllm.get("max_model_len")
    if (isinstance(context, int) and isinstance(max_len, int) and not isinstance(context, bool)
            and context > max_len):
        model_info["context_window"] = max_len
        out.drop(f"{where} model_info.context_window", f"{context} promised callers more than max_model_len "
                 f"{max_len} serves; lowered to {max_len}", changed=True)


def _float_or_str(value: str) -> JSON:
    try:
        return float(value)
    except ValueError:
        return value




@dataclass(frozen=True)
class _Catalog:
    """models.yaml's recipes, by model name."""

    recipes: dict[str, JSON]
    comments: Comments
    dropped: tuple[Dropped, ...]


@dataclass(frozen=True)
class _Boxes:
    """fleet.hosts' rows that run an imported model, by box, and the legacy pairs among them."""

    rows: dict[str, list[_Row]]
    legacy: set[tuple[str, int]]  # the --legacy pairs given, as box names and listen ports
    placed_legacy: set[tuple[str, int]]  # those a row runs
    dropped: tuple[Dropped, ...]


@dataclass(frozen=True)
class _Placement:
    hosts: dict[str, JSON]
    comments: Comments
    static: bool  # some box is provider static
    runpod: tuple[str, ...]  # the boxes named by a RunPod pod id
    dropped: tuple[Dropped, ...]


@dataclass(frozen=True)
class _File:
    """One output file's data, its comments, and what making it left out or changed."""

    data: dict[str, JSON]
    comments: Comments
    dropped: tuple[Dropped, ...]
    env: tuple[EnvVar, ...] = ()


def _sections(config: Mapping[str, Frozen]) -> tuple[Mapping[str, Frozen], Mapping[str, Frozen]]:
    """config.yaml's `fleet:` and its `hosts:`; LlmaoImportError without them."""
    fleet_in = config.get("fleet")
    if not isinstance(fleet_in, Mapping):
        raise LlmaoImportError("config.yaml has no fleet: section (llmao keeps its placement there)")
    hosts = fleet_in.get("hosts")
    if not isinstance(hosts, Mapping):
        raise LlmaoImportError("config.yaml has no fleet.hosts mapping (box -> rows)")
    return fleet_in, hosts


def _has_vast(fleet_in: Mapping[str, Frozen]) -> bool:
    vast = fleet_in.get("vast")
    return isinstance(vast, Mapping) and vast.get("api_key") == SECRET


def _catalog(catalog: Mapping[str, Frozen]) -> _Catalog:
    """models.yaml's self-hosted entries as recipes (the first of a repeated model_name)."""
    out = _Out()
    recipes: dict[str, JSON] = {}
    comments: Comments = {}
    entries = catalog.get("models")
    if not isinstance(entries, tuple):
        raise LlmaoImportError("models.yaml has no models: list")
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            out.drop(f"models.yaml models[{i}]", "not a mapping; left out")
            continue
        made = _recipe(i, entry, out)
        if made is None:
            continue
        name, recipe, recipe_comments = made
        if name in recipes:
            out.drop(f"models.yaml models[{i}] ({name})", "a second entry with this model_name: llmao would "
                                                          "have used one of them; the first is kept")
            continue
        recipes[name] = recipe
        comments.update({("models", name, *path): text for path, text in recipe_comments.items()})
    for key in catalog:
        if key != "models":
            out.drop(f"models.yaml {key}", "only models: is read; left out")
    return _Catalog(recipes, comments, tuple(out.dropped))


def _boxes(hosts: Mapping[str, Frozen], recipes: Mapping[str, JSON], legacy: frozenset[tuple[str, int]]) -> _Boxes:
    """The rows of fleet.hosts that run an imported model, by box name (::ffff: stripped)."""
    out = _Out()
    legacy_boxes = {(normalise_host(h), p) for h, p in legacy}
    placed_legacy: set[tuple[str, int]] = set()
    boxes: dict[str, list[_Row]] = {}
    for row in _rows(hosts, out):
        if row.model not in recipes:
            out.drop(f"config.yaml fleet.hosts.{row.host}[{row.index}]", f"model {row.model} is not a self-hosted "
                     "model imported from models.yaml; left out")
            continue
        boxes.setdefault(row.box, []).append(row)
        if (row.box, row.port) in legacy_boxes:
            placed_legacy.add((row.box, row.port))
    for pair in sorted(legacy_boxes - placed_legacy):
        out.drop(f"--legacy {pair[0]}:{pair[1]}", "no fleet.hosts row runs on this box and port; not declared")
    return _Boxes(boxes, legacy_boxes, placed_legacy, tuple(out.dropped))


def _placement(hosts: Mapping[str, Frozen], boxes: _Boxes, has_vast: bool) -> _Placement:
    """placement.yaml: each box with its provider (vast, runpod for a pod id, else static) and its rows."""
    out = _Out()
    placement: dict[str, JSON] = {}
    comments: Comments = {}
    static_boxes = False
    runpod_boxes: list[str] = []
    for box, box_rows in boxes.rows.items():
        pinned = [r for r in box_rows if r.public_port is not None]
        provider = "vast" if has_vast and len(pinned) < len(box_rows) else "static"
        if not _is_address(box):  # a RunPod pod id (RUNPOD_POD_ID): only RunPod's listing knows its address
            provider = "runpod"
            runpod_boxes.append(box)
            out.drop(f"config.yaml fleet.hosts.{box_rows[0].host}", "not an IP address, so a RunPod pod id: "
                     "provider runpod, whose listing gives its address and ports (provide RUNPOD_API_KEY)",
                     changed=True)
        static_boxes = static_boxes or provider == "static"
        servers: list[JSON] = []
        for row in box_rows:
            item: list[JSON] = [row.model, row.port]
            if row.name is not None or row.public_port is not None:
                item.append(row.name)
            if row.public_port is not None:
                item.append(row.public_port)
            servers.append(item)
            where = f"fleet.hosts.{row.host}[{row.index}]"
            note = where
            if row.public_port is not None:
                note += (f"; public port {row.public_port} written by hand, kept (llmao never overrides it; "
                         "fleetllm warns it is deprecated: drop it once the provider's listing has the box)")
            if (row.box, row.port) in boxes.legacy:
                note += "; a legacy pair: shared fleet.selfhost_api_key"
            comments[("hosts", box, "servers", len(servers) - 1)] = note
        placement[box] = {"provider": provider, "servers": servers}
        why = ("fleet.vast is configured and the listing maps its listen ports" if provider == "vast" else
               "a pod id: RunPod's listing maps its listen ports" if provider == "runpod" else
               "every row pins its public port" if pinned and has_vast else
               "no fleet.vast in llmao: public port = listen port (or the pinned one)")
        written = hosts.get(box_rows[0].host)
        comments[("hosts", box)] = f"from config.yaml fleet.hosts.{box_rows[0].host}; provider {provider}: {why}"
        if not isinstance(written, tuple) or len(box_rows) != len(written):
            comments[("hosts", box)] += " (some rows left out: see the import report)"
    return _Placement(placement, comments, static_boxes, tuple(runpod_boxes), tuple(out.dropped))


def _listen_ports(boxes: _Boxes) -> tuple[list[int], tuple[Dropped, ...]]:
    """llmao's listen ports (8001-8003) and every other one its rows use, legacy pairs aside; 16 at most."""
    out = _Out()
    ports = set(DEFAULT_LISTEN_PORTS)
    ports.update(r.port for rs in boxes.rows.values() for r in rs if (r.box, r.port) not in boxes.legacy)
    listen = sorted(ports)
    if len(listen) > 16:
        out.drop("config.yaml fleet.hosts (listen ports)", f"{len(listen)} different listen ports; fleetllm takes "
                 "16 at most: the boxes using the others will not validate")
        listen = listen[:16]
    return listen, tuple(out.dropped)


def _reconcile(fleet_in: Mapping[str, Frozen]) -> _File:
    """fleet.yaml `reconcile:` from llmao's health knobs, each brought within what fleetllm allows."""
    out = _Out()
    reconcile: dict[str, JSON] = {}
    comments: Comments = {}
    for knob, (target, minimum, kind) in HEALTH_KNOBS.items():
        if knob not in fleet_in:
            continue
        value = _num(fleet_in[knob])
        if value is None:
            out.drop(f"config.yaml fleet.{knob}", "not a number; fleetllm's default is used")
            continue
        carried: JSON = int(value) if kind is int else value
        if target == "probe_timeout_s" and value > 120:
            carried = 120.0
            out.drop(f"config.yaml fleet.{knob}", f"{value:g} s is more than fleetllm's probe timeout allows; 120 is "
                                                  "used", changed=True)
        elif value < minimum or (kind is int and value != int(value)):
            carried = max(int(minimum) if kind is int else minimum, int(value) if kind is int else value)
            out.drop(f"config.yaml fleet.{knob}", f"{value:g} is below what fleetllm allows for {target}; "
                                                  f"{carried} is used", changed=True)
        reconcile[target] = carried
        comments[("reconcile", target)] = f"from config.yaml fleet.{knob}"
    if "health_fail_threshold" in fleet_in:
        reconcile["up_after_successes"] = 2
        comments[("reconcile", "up_after_successes")] = ("llmao recovers on 1 good probe; fleetllm waits for 2 "
                                                         "in a row so a flapping server does not flap routes")
        out.drop("config.yaml fleet.health_fail_threshold (recovery)", "llmao recovers after one good probe; "
                 "fleetllm after up_after_successes: 2", changed=True)
    return _File(reconcile, comments, tuple(out.dropped))


def _fleet_file(fleet_in: Mapping[str, Frozen], boxes: _Boxes) -> _File:
    """fleet.yaml: the listen ports, the capacity per box, the legacy pairs and the reconcile knobs."""
    comments: Comments = {}
    listen, dropped = _listen_ports(boxes)
    fleet: dict[str, JSON] = {"version": 1, "fleet_id": IMPORTED_FLEET_ID, "listen_ports": list[JSON](listen)}
    comments[("fleet_id",)] = ("this fleet's id in LiteLLM (its deployments carry it): unique among the fleets "
                               "that share one LiteLLM; keep it once applied")
    comments[("listen_ports",)] = ("llmao's VLLM_LISTEN_PORTS (8001-8003) and every other listen port its "
                                   "rows use (legacy pairs aside)")
    most = max((len(rs) for rs in boxes.rows.values()), default=3)
    fleet["max_servers_per_box"] = max(3, most)
    comments[("max_servers_per_box",)] = "llmao: at most three per box (more only with legacy pairs)"
    if not boxes.rows:
        fleet["allow_empty_placement"] = True
        comments[("allow_empty_placement",)] = "llmao's fleet.hosts had no box to import"
    if boxes.placed_legacy:
        fleet["legacy_servers"] = [{"host": h, "port": p, "note": "llmao LEGACY_SERVERS: predates the salt"}
                                   for h, p in sorted(boxes.placed_legacy)]
        comments[("legacy_servers",)] = ("llmao's LEGACY_SERVERS (given with --legacy): they keep the shared "
                                         "fleet.selfhost_api_key")
    reconcile = _reconcile(fleet_in)
    comments.update(reconcile.comments)
    if reconcile.data:
        fleet["reconcile"] = reconcile.data
    return _File(fleet, comments, (*dropped, *reconcile.dropped))


def _left_out(config: Mapping[str, Frozen], fleet_in: Mapping[str, Frozen]) -> tuple[Dropped, ...]:
    """The settings of config.yaml no output file carries: knobs fleetllm has no use for, unknown keys, and
    llmao's own application settings."""
    out = _Out()
    for knob, reason in NOT_CARRIED.items():
        if knob in fleet_in:
            out.drop(f"config.yaml fleet.{knob}", reason)
    known = {"key", "vllm_api_salt", "hosts", "vast", "selfhost_api_key", *HEALTH_KNOBS, *NOT_CARRIED}
    for key in fleet_in:
        if key not in known:
            out.drop(f"config.yaml fleet.{key}", "not a setting the importer knows; left out")
    vast = fleet_in.get("vast")
    if isinstance(vast, Mapping):
        for key in vast:
            if key != "api_key":
                out.drop(f"config.yaml fleet.vast.{key}", "not a setting of fleetllm's Vast provider; left out")
    for key in config:
        if key == "litellm":
            out.drop("config.yaml litellm", "only its url is carried over (control-plane.yaml litellm.url); the "
                     "master key is a reference to provide")
        elif key != "fleet":
            out.drop(f"config.yaml {key}", "llmao's own application settings, not the fleet; left out")
    return tuple(out.dropped)


def _secrets(fleet_in: Mapping[str, Frozen], placed_legacy: set[tuple[str, int]]) -> _File:
    """control-plane.yaml `secrets:` as references, and the variables to export for them."""
    out = _Out()
    env: list[EnvVar] = []
    secrets: dict[str, JSON] = {}
    comments: Comments = {}
    if fleet_in.get("key") == SECRET:
        secrets["fleet_key"] = f"${{env:{ENV_FLEET_KEY}}}"
        comments[("secrets", "fleet_key")] = "llmao config.yaml fleet.key: the same value (baked into every box)"
        env.append(EnvVar(ENV_FLEET_KEY, "config.yaml fleet.key", "the fleet key baked into every box template: "
                          "the same value, so the boxes keep their template"))
    else:
        out.drop("config.yaml fleet.key", "absent: boxes would get 503 from fleetllm until secrets.fleet_key is set")
    secrets["vllm_api_salt"] = f"${{env:{ENV_SALT}}}"
    comments[("secrets", "vllm_api_salt")] = "llmao config.yaml fleet.vllm_api_salt: the same value, same bearers"
    env.append(EnvVar(ENV_SALT, "config.yaml fleet.vllm_api_salt", "the bearer salt: the same value (without "
                      "surrounding whitespace, as llmao strips it), so every bearer stays as it is"))
    if fleet_in.get("vllm_api_salt") != SECRET:
        out.drop("config.yaml fleet.vllm_api_salt", "absent: llmao requires it; give fleetllm the salt your boxes' "
                                                     "bearers were derived with")
    if fleet_in.get("selfhost_api_key") == SECRET:
        if placed_legacy:
            secrets["legacy_api_key"] = f"${{env:{ENV_LEGACY}}}"
            comments[("secrets", "legacy_api_key")] = "llmao config.yaml fleet.selfhost_api_key (legacy pairs)"
            env.append(EnvVar(ENV_LEGACY, "config.yaml fleet.selfhost_api_key", "the shared bearer of the legacy "
                              "pairs"))
        else:
            out.drop("config.yaml fleet.selfhost_api_key", "no legacy pair was given (--legacy HOST:PORT for each "
                     "of llmao's LEGACY_SERVERS), so nothing uses it")
    elif placed_legacy:
        out.drop("--legacy", "legacy pairs without fleet.selfhost_api_key: set secrets.legacy_api_key by hand")
    return _File(secrets, comments, tuple(out.dropped), tuple(env))


def _litellm(config: Mapping[str, Frozen], litellm_url: str | None) -> _File:
    """control-plane.yaml `litellm:`: --litellm-url, else llmao's litellm.url; the master key a reference."""
    llmao_litellm = config.get("litellm")
    if litellm_url is None and isinstance(llmao_litellm, Mapping) and isinstance(llmao_litellm.get("url"), str):
        litellm_url = str(llmao_litellm["url"])
    litellm: dict[str, JSON] = {"url": litellm_url or "http://127.0.0.1:4000",
                                "master_key": f"${{env:{ENV_LITELLM}}}"}
    comments: Comments = {("litellm",): ("the LiteLLM proxy llmao writes to" if litellm_url else
                                         "CHANGE: the URL of the LiteLLM proxy llmao writes to (--litellm-url)")}
    env = (EnvVar(ENV_LITELLM, "llmao's LiteLLM master key (its deployment settings)", "the master key of "
                  "the LiteLLM proxy llmao writes to"),)
    return _File(litellm, comments, (), env)


def _providers(fleet_in: Mapping[str, Frozen], placement: _Placement) -> _File:
    """control-plane.yaml `providers:`: Vast when llmao had its key, RunPod for pod ids, static otherwise."""
    out = _Out()
    env: list[EnvVar] = []
    providers: dict[str, JSON] = {}
    comments: Comments = {}
    if _has_vast(fleet_in):
        providers["vast"] = {"api_key": f"${{env:{ENV_VAST}}}"}
        comments[("providers", "vast")] = "llmao config.yaml fleet.vast.api_key"
        env.append(EnvVar(ENV_VAST, "config.yaml fleet.vast.api_key", "the Vast API key: fleetllm reads the "
                          "instance listing for the public ports, as llmao does"))
    elif isinstance(fleet_in.get("vast"), Mapping):
        out.drop("config.yaml fleet.vast", "a vast block without api_key; no Vast provider configured")
    if placement.runpod:
        providers["runpod"] = {"api_key": f"${{env:{ENV_RUNPOD}}}"}
        comments[("providers", "runpod")] = "boxes named by a pod id: " + ", ".join(placement.runpod)
        env.append(EnvVar(ENV_RUNPOD, "your RunPod account (llmao has no RunPod key)", "fleetllm reads the pod "
                          "listing for the address and ports of the boxes named by a pod id"))
    if placement.static or not providers:
        providers["static"] = {}
        comments[("providers", "static")] = "boxes whose public port is the listen port or pinned by hand"
    return _File(providers, comments, tuple(out.dropped), tuple(env))


def _control_plane(config: Mapping[str, Frozen], fleet_in: Mapping[str, Frozen], boxes: _Boxes,
                   placement: _Placement, repo_path: str, litellm_url: str | None) -> _File:
    """control-plane.yaml (secrets as references) and the variables to export."""
    secrets = _secrets(fleet_in, boxes.placed_legacy)
    litellm = _litellm(config, litellm_url)
    providers = _providers(fleet_in, placement)
    data: dict[str, JSON] = {
        "repo": {"path": repo_path, "branch": "main"},
        "secrets": secrets.data,
        "listen": "127.0.0.1:8080",
        "state": {"url": "sqlite:///.fleetllm-state/control-plane.sqlite3"},
        "litellm": litellm.data,
        "providers": providers.data,
    }
    comments: Comments = {**secrets.comments, **litellm.comments, **providers.comments}
    comments[("repo",)] = "the fleet repository this import wrote (commit changes to main)"
    comments[("listen",)] = "loopback: put TLS in front, or set tls: {cert, key} (boxes send the fleet key)"
    parts = (secrets, litellm, providers)
    return _File(data, comments, tuple(d for p in parts for d in p.dropped), tuple(e for p in parts for e in p.env))


def _document(data: dict[str, JSON], comments: Comments, header: tuple[str, ...]) -> Document:
    return Document(freeze_mapping(data), MappingProxyType(comments), header)


def import_llmao(config: Mapping[str, Frozen], catalog: Mapping[str, Frozen],
                 legacy: frozenset[tuple[str, int]] = frozenset(), *, repo_path: str = ".",
                 litellm_url: str | None = None) -> Imported:
    """Map llmao's config.yaml (`config`, secrets replaced by SECRET) and models.yaml (`catalog`).

    `legacy`: llmao's LEGACY_SERVERS pairs (host, listen port). Raises LlmaoImportError when there is nothing
    to import (no `fleet.hosts`). Each file is one step; the report lists what each left out, in order."""
    fleet_in, hosts = _sections(config)
    catalog_out = _catalog(catalog)
    boxes = _boxes(hosts, catalog_out.recipes, legacy)
    placement = _placement(hosts, boxes, _has_vast(fleet_in))
    fleet = _fleet_file(fleet_in, boxes)
    left_out = _left_out(config, fleet_in)
    control_plane = _control_plane(config, fleet_in, boxes, placement, repo_path, litellm_url)
    origin = ("Imported from llmao by `fleetllm import llmao`; the comments say where each value came from.",)
    return Imported(
        fleet=_document(fleet.data, fleet.comments, origin),
        models=_document({"models": catalog_out.recipes}, catalog_out.comments, origin),
        placement=_document({"hosts": placement.hosts}, placement.comments,
                            (*origin, "Box names are llmao's fleet.hosts keys (::ffff: stripped): the bearers stay "
                                      "the same.")),
        control_plane=_document(control_plane.data, control_plane.comments,
                                ("The control plane's config. Secrets are references, never values: export the",
                                 "variables `fleetllm import llmao` listed.")),
        dropped=(*catalog_out.dropped, *boxes.dropped, *placement.dropped, *fleet.dropped, *left_out,
                 *control_plane.dropped),
        env=control_plane.env, legacy=frozenset(boxes.placed_legacy))


SECRET_WORDS = frozenset({"secret", "password", "passwd", "token", "authorization", "cookie", "credential",
                          "credentials", "signature", "apikey"})
SECRET_PAIRS = ("api_key", "access_key", "private_key", "secret_key", "auth_key")
REFERENCE = "os.environ/"  # LiteLLM's own reference to its environment: no secret in the file


def _is_secret(key: str, value: Frozen) -> bool:
    name = key.lower().replace("-", "_")
    named = bool(SECRET_WORDS & set(name.split("_"))) or any(pair in name for pair in SECRET_PAIRS)
    return named and not (isinstance(value, str) and value.startswith(REFERENCE))


def secret_param(key: str, value: Frozen) -> str | None:
    """The litellm_params key (or `key.header`) holding a literal secret (an `extra_headers` Authorization, an
    `aws_secret_access_key`, ...), or None. A value `os.environ/NAME` is LiteLLM's reference, kept."""
    if isinstance(value, Mapping):
        inner = [f"{key}.{k}" for k, v in value.items() if _is_secret(str(k), v)]
        return ", ".join(inner) if inner else None
    return key if _is_secret(key, value) else None


def without_secrets(value: Mapping[str, Frozen]) -> dict[str, JSON]:
    return {str(k): thaw(v) for k, v in value.items() if not _is_secret(str(k), v)}
