"""Building the typed model from schema-checked YAML values.

The builder is defensive: when a file has schema errors it skips the elements those errors are in
(and keeps the rest), so that semantic rules can still report everything else in the same run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetllm.core.fleet.files import FLEET_FILE, MODELS_FILE, PLACEMENT_FILE
from fleetllm.core.fleet.flags import split_args
from fleetllm.core.fleet.jsonvalue import JSON, freeze_mapping
from fleetllm.core.fleet.model import (
    Box,
    CapacitySettings,
    FleetSettings,
    LitellmRoute,
    Pool,
    Provider,
    Recipe,
    ReconcileMode,
    ReconcileSettings,
    RolloutMode,
    RolloutSettings,
    ServerRow,
    VllmRecipe,
    frozen_map,
)

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class Finding:
    """A problem found in a file at a path; turned into a positioned Diagnostic by the caller."""

    file: str
    path: Path_
    message: str
    rule: str
    warning: bool = False
    key: str | None = None  # when set, point at this key of the mapping at `path`


@dataclass
class Built:
    settings: FleetSettings
    recipes: dict[str, Recipe]
    boxes: dict[str, Box]
    row_paths: dict[tuple[str, int], Path_] = field(default_factory=dict)
    broken_recipes: set[str] = field(default_factory=set)  # in models.yaml but malformed
    findings: list[Finding] = field(default_factory=list)


def _tainted(errors: set[Path_], path: Path_) -> bool:
    """True when some schema error lies at or below `path`."""
    n = len(path)
    return any(e[:n] == path for e in errors)


def _num(value: JSON) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: JSON) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def build_settings(value: JSON, errors: set[Path_]) -> FleetSettings:
    if not isinstance(value, dict):
        return FleetSettings()
    defaults = FleetSettings()
    ports = value.get("listen_ports")
    listen = (tuple(p for p in ports if isinstance(p, int)) if isinstance(ports, list)
              and not _tainted(errors, ("listen_ports",)) else defaults.listen_ports)
    legacy: set[tuple[str, int]] = set()
    pairs = value.get("legacy_servers")
    for i, item in enumerate(pairs if isinstance(pairs, list) else []):
        if isinstance(item, dict) and not _tainted(errors, ("legacy_servers", i)):
            host, port = item.get("host"), item.get("port")
            if isinstance(host, str) and isinstance(port, int):
                legacy.add((host, port))
    knobs = value.get("reconcile")
    reconcile = ReconcileSettings()
    if isinstance(knobs, dict):
        kwargs = {k: v for k, v in knobs.items()
                  if k in ReconcileSettings.__dataclass_fields__ and not _tainted(errors, ("reconcile", k))}
        reconcile = ReconcileSettings(**kwargs)  # type: ignore[arg-type]
    rollout = build_rollout(value.get("rollout"), errors)
    max_servers = value.get("max_servers_per_box")
    allow_empty = value.get("allow_empty_placement")
    fleet_id = value.get("fleet_id")
    return FleetSettings(
        listen_ports=listen or defaults.listen_ports,
        max_servers_per_box=max_servers if isinstance(max_servers, int) and max_servers > 0
        else defaults.max_servers_per_box,
        allow_empty_placement=allow_empty if isinstance(allow_empty, bool) else defaults.allow_empty_placement,
        legacy_servers=frozenset(legacy),
        reconcile=reconcile,
        rollout=rollout,
        capacity=build_capacity(value.get("capacity"), errors),
        fleet_id=fleet_id if isinstance(fleet_id, str) and not _tainted(errors, ("fleet_id",)) else None,
    )


def build_capacity(value: JSON, errors: set[Path_]) -> CapacitySettings | None:
    """fleet.yaml `capacity:`; None when absent or when any of it has a schema error (a declaration that spends
    money is taken whole or not at all: the fleet is invalid then anyway)."""
    if not isinstance(value, dict) or _tainted(errors, ("capacity",)):
        return None
    ceiling = _num(value.get("max_fleet_per_hour"))
    pools_value = value.get("pools")
    if ceiling is None or not isinstance(pools_value, dict):
        return None
    pools: dict[str, Pool] = {}
    for name, spec in pools_value.items():
        if not isinstance(spec, dict):
            return None
        provider, gpu, gpus, count = spec.get("provider"), spec.get("gpu"), _int(spec.get("gpus")), \
            _int(spec.get("count"))
        price = _num(spec.get("max_per_hour"))
        if (provider not in {p.value for p in Provider} or not isinstance(gpu, str) or gpus is None or count is None
                or price is None):
            return None
        regions = spec.get("regions")
        image, template, disk = spec.get("image"), spec.get("template"), _int(spec.get("disk_gb"))
        pools[name] = Pool(name, Provider(provider), gpu, gpus, count, price,
                           image if isinstance(image, str) else None, template if isinstance(template, str) else None,
                           tuple(r for r in regions if isinstance(r, str)) if isinstance(regions, list) else (), disk)
    valves = {k: v for k in ("max_rentals_per_pass", "max_terminations_per_pass")
              if (v := _int(value.get(k))) is not None}
    return CapacitySettings(ceiling, frozen_map(pools), **valves)


def build_rollout(value: JSON, errors: set[Path_]) -> RolloutSettings:
    """fleet.yaml `rollout:`; a field with a schema error keeps its default."""
    if not isinstance(value, dict):
        return RolloutSettings()
    kwargs: dict[str, object] = {k: v for k, v in value.items()
                                 if k in ("max_unavailable", "poll_s", "drain_s", "retire_s") and _int(v) is not None
                                 and not _tainted(errors, ("rollout", k))}
    mode = value.get("mode")
    if mode in {m.value for m in RolloutMode} and not _tainted(errors, ("rollout", "mode")):
        kwargs["mode"] = RolloutMode(mode)
    return RolloutSettings(**kwargs)  # type: ignore[arg-type]


def build_recipe(name: str, value: dict[str, JSON], findings: list[Finding]) -> Recipe | None:
    vllm = value.get("vllm")
    if not isinstance(vllm, dict) or not isinstance(model := vllm.get("model"), str):
        return None
    raw_args = vllm.get("args")
    args: tuple[str, ...] = ()
    if isinstance(raw_args, str):
        try:
            args = split_args(raw_args)
        except ValueError as exc:
            findings.append(Finding(MODELS_FILE, ("models", name, "vllm", "args"),
                                    f"args cannot be split shell-style: {exc}; use a list of strings",
                                    "args-syntax"))
    elif isinstance(raw_args, list):
        args = tuple(a for a in raw_args if isinstance(a, str))
    settings = vllm.get("settings")
    served = vllm.get("served_model_name")
    litellm = value.get("litellm") if isinstance(value.get("litellm"), dict) else {}
    assert isinstance(litellm, dict)
    grace = value.get("health_grace_s")
    description = value.get("description")
    return Recipe(
        name=name,
        vllm=VllmRecipe(
            model=model,
            served_model_name=served if isinstance(served, str) else name,
            args=args,
            settings=freeze_mapping(settings if isinstance(settings, dict) else {}),
            max_model_len=_int(vllm.get("max_model_len")),
            gpu_memory_utilization=_num(vllm.get("gpu_memory_utilization")),
            vram_gb=_num(vllm.get("vram_gb")),
            disk_gb=_num(vllm.get("disk_gb")),
            kv_bytes_per_token=_int(vllm.get("kv_bytes_per_token")),
            allow_options=frozenset(o for o in allowed if isinstance(o, str))
            if isinstance(allowed := vllm.get("allow_options"), list) else frozenset(),
        ),
        litellm=LitellmRoute(
            params=freeze_mapping(litellm.get("params") if isinstance(litellm.get("params"), dict) else {}),
            model_info=freeze_mapping(litellm.get("model_info")
                                      if isinstance(litellm.get("model_info"), dict) else {}),
        ),
        reconcile=ReconcileMode.PAUSED if value.get("reconcile") == "paused" else ReconcileMode.ACTIVE,
        health_grace_s=_int(grace),
        description=description if isinstance(description, str) else None,
        max_unavailable=_int(value.get("max_unavailable")),
    )


def build_recipes(value: JSON, errors: set[Path_], built: Built) -> None:
    models = value.get("models") if isinstance(value, dict) else None
    if not isinstance(models, dict):
        return
    for name, item in models.items():
        recipe = None
        if isinstance(item, dict) and not _tainted(errors, ("models", name)):
            recipe = build_recipe(name, item, built.findings)
        if recipe is None:
            built.broken_recipes.add(name)
        else:
            built.recipes[name] = recipe


def _row(value: JSON) -> ServerRow | None:
    if not isinstance(value, list) or len(value) < 2:
        return None
    model, port = value[0], value[1]
    name = value[2] if len(value) > 2 else None
    public = value[3] if len(value) > 3 else None
    if not isinstance(model, str) or _int(port) is None:
        return None
    assert isinstance(port, int)
    return ServerRow(model=model, port=port, name=name if isinstance(name, str) else model,
                     public_port=_int(public))


def build_boxes(value: JSON, errors: set[Path_], built: Built) -> None:
    hosts = value.get("hosts") if isinstance(value, dict) else None
    if not isinstance(hosts, dict):
        return
    for box_name, entry in hosts.items():
        base: Path_ = ("hosts", box_name)
        details: Mapping[str, JSON] = entry if isinstance(entry, dict) else {}
        rows_value = entry if isinstance(entry, list) else details.get("servers")
        rows_path: Path_ = base if isinstance(entry, list) else (*base, "servers")
        if not isinstance(rows_value, list) or any(
                e[:len(base)] == base and len(e) <= len(rows_path) for e in errors):
            continue  # the box itself (not one of its rows) is malformed
        servers: list[ServerRow] = []
        for index, raw in enumerate(rows_value):
            row_path = (*rows_path, index)
            row = None if _tainted(errors, row_path) else _row(raw)
            if row is None:
                continue
            built.row_paths[(box_name, len(servers))] = row_path
            servers.append(row)
        provider = details.get("provider")
        built.boxes[box_name] = Box(
            name=box_name,
            servers=tuple(servers),
            provider=Provider(provider) if provider in {p.value for p in Provider} else None,
            gpu_memory_gb=_num(details.get("gpu_memory_gb")),
            gpus=_int(details.get("gpus")),
            disk_gb=_num(details.get("disk_gb")),
            notes=notes if isinstance(notes := details.get("notes"), str) else None,
            reconcile=ReconcileMode.PAUSED if details.get("reconcile") == "paused" else ReconcileMode.ACTIVE,
            gateway_port=_int(details.get("gateway")),  # an error there skipped the whole box above
            rollout=RolloutMode(mode) if (mode := details.get("rollout")) in {m.value for m in RolloutMode}
            else None,
        )


def build(settings_value: JSON, models_value: JSON, placement_value: JSON,
          errors: Mapping[str, set[Path_]]) -> Built:
    built = Built(settings=build_settings(settings_value, errors.get(FLEET_FILE, set())), recipes={}, boxes={})
    build_recipes(models_value, errors.get(MODELS_FILE, set()), built)
    build_boxes(placement_value, errors.get(PLACEMENT_FILE, set()), built)
    return built
