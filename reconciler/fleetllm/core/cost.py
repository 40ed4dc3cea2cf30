"""What the fleet costs, in USD per hour: per box, per model and for the whole fleet. Pure.

The cost model (docs/cost.md says it for operators):

- A box's price is what its provider bills for it per hour, read from the provider's listing the
  reconciler already makes (Vast `dph_total`, RunPod `costPerHr`/`cost`): `PriceSource.LISTING`. A box
  not rented yet is priced from the offer it would be rented from (`PriceSource.OFFER`), or, before an
  offer is known, at the most a declaration allows it to cost (`PriceSource.CEILING`, shown "at most").
- A box with no price (its provider's listing failed, no key configured, a static box) is *unpriced*:
  it is named as such and counts as nothing, never as $0 silently.
- A model's cost is the share of each of its boxes that its servers take: a box's price divided among
  its servers in proportion to their recipes' `vram_gb` when every server on the box has one (the same
  weights the stable card division uses), else evenly. An empty box costs the fleet, not a model.
- The fleet's cost is the sum of its priced boxes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from fleetllm.core.fleet.jsonvalue import JSON
from fleetllm.core.fleet.model import Box, Fleet, Pool, Provider

PROVIDER_NAMES = {Provider.RUNPOD: "RunPod", Provider.VAST: "Vast", Provider.STATIC: "static"}
RENTED = frozenset({Provider.RUNPOD, Provider.VAST})  # the providers that bill by the hour


class PriceSource(StrEnum):
    LISTING = "listing"  # the provider's listing of the rented box
    OFFER = "offer"  # the offer a rental would take (not rented yet)
    CEILING = "ceiling"  # the most a declaration lets it cost (no offer known yet)


@dataclass(frozen=True)
class BoxPrice:
    box: str
    provider: Provider
    per_hour: float  # USD
    gpu: str = ""
    gpus: int | None = None
    source: PriceSource = PriceSource.LISTING

    def what(self) -> str:
        """`1 × H100 80GB on RunPod`."""
        return f"{self.gpus or 1} × {self.gpu or 'GPU'} on {PROVIDER_NAMES.get(self.provider, str(self.provider))}"

    def as_json(self) -> dict[str, JSON]:
        return {"provider": str(self.provider), "per_hour": round(self.per_hour, 4), "gpu": self.gpu,
                "gpus": self.gpus, "source": str(self.source)}

    @classmethod
    def from_json(cls, box: str, data: Mapping[str, JSON]) -> BoxPrice:
        """One entry of a prices document (`prices_json`); ValueError/KeyError/TypeError when it is not one."""
        per_hour = data["per_hour"]
        if isinstance(per_hour, bool) or not isinstance(per_hour, (int, float)) or per_hour < 0:
            raise ValueError(f"prices.{box}.per_hour: a non-negative number of USD per hour, not {per_hour!r}")
        gpus = data.get("gpus")
        gpu = data.get("gpu") or ""
        return cls(box, Provider(str(data["provider"])), float(per_hour), str(gpu),
                   gpus if isinstance(gpus, int) and not isinstance(gpus, bool) else None,
                   PriceSource(str(data.get("source", PriceSource.LISTING))))


def money(usd: float, *, sign: bool = False) -> str:
    """`$2.49/h`; with `sign`, `+$2.49/h` or `-$2.49/h`."""
    text = f"${abs(usd):,.2f}/h"
    if not sign:
        return text if usd >= 0 else "-" + text
    return ("-" if usd < 0 else "+") + text


def prices_json(prices: Mapping[str, BoxPrice]) -> dict[str, JSON]:
    return {name: price.as_json() for name, price in sorted(prices.items())}


def read_prices(document: JSON) -> dict[str, BoxPrice]:
    """The `prices` object of a JSON document (a plan file of `fleetllm plan --out`, or one written by hand):
    `{"prices": {BOX: {"provider", "per_hour", "gpu", "gpus", "source"}}}`. ValueError names what is wrong."""
    found = document.get("prices") if isinstance(document, dict) else None
    if not isinstance(found, dict):
        raise ValueError("no `prices` object (write one with `fleetllm plan --out FILE`)")
    out: dict[str, BoxPrice] = {}
    for box, entry in found.items():
        if not isinstance(entry, dict):
            raise ValueError(f"prices.{box}: an object with provider and per_hour")
        try:
            out[box] = BoxPrice.from_json(box, entry)
        except KeyError as exc:
            raise ValueError(f"prices.{box}: {exc.args[0]} is missing") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"prices.{box}: {exc}") from None
    return out


@dataclass(frozen=True)
class FleetCost:
    boxes: Mapping[str, BoxPrice]  # the fleet's priced boxes
    unpriced: tuple[str, ...]  # rented boxes (Vast, RunPod) of the fleet with no price known
    models: Mapping[str, float]  # model -> its share, USD per hour
    total: float  # the priced boxes' sum

    def box(self, name: str) -> float | None:
        price = self.boxes.get(name)
        return price.per_hour if price is not None else None


def _shares(fleet: Fleet, box: Box) -> dict[str, float]:
    """Each model's share of one box (fractions summing to 1; empty for an empty box)."""
    if not box.servers:
        return {}
    weights = [fleet.recipes[row.model].vllm.vram_gb if row.model in fleet.recipes else None for row in box.servers]
    if all(w is not None and w > 0 for w in weights):
        total = sum(w for w in weights if w is not None)
        parts = [(w or 0.0) / total for w in weights]
    else:
        parts = [1 / len(box.servers)] * len(box.servers)
    shares: dict[str, float] = {}
    for row, part in zip(box.servers, parts, strict=True):
        shares[row.model] = shares.get(row.model, 0.0) + part
    return shares


def fleet_cost(fleet: Fleet, prices: Mapping[str, BoxPrice]) -> FleetCost:
    """The cost of `fleet`'s placed boxes at `prices` (box name -> price)."""
    priced: dict[str, BoxPrice] = {}
    unpriced: list[str] = []
    models: dict[str, float] = {}
    for name, box in fleet.boxes.items():
        price = prices.get(name)
        if price is None:
            if box.provider in RENTED:
                unpriced.append(name)
            continue
        priced[name] = price
        for model, share in _shares(fleet, box).items():
            models[model] = models.get(model, 0.0) + share * price.per_hour
    return FleetCost(MappingProxyType(priced), tuple(sorted(unpriced)), MappingProxyType(dict(sorted(models.items()))),
                     sum(p.per_hour for p in priced.values()))


@dataclass(frozen=True)
class CostLine:
    """One kind of capacity a change adds or removes: `+$2.49/h: 1 × H100 80GB on RunPod`."""

    delta: float  # USD per hour, signed
    gpus: int
    gpu: str
    provider: Provider
    boxes: tuple[str, ...]
    at_most: bool = False  # priced at a declaration's ceiling, not a listing or an offer

    def text(self) -> str:
        what = f"{self.gpus} × {self.gpu or 'GPU'} on {PROVIDER_NAMES.get(self.provider, str(self.provider))}"
        bound = "at most " if self.at_most else ""  # priced at a pool's max_per_hour: no offer known
        return f"{bound}{money(self.delta, sign=True)}: {what} ({', '.join(self.boxes)})"


@dataclass(frozen=True)
class CostChange:
    lines: tuple[CostLine, ...]
    before: float
    after: float
    unpriced: tuple[str, ...]  # boxes added or removed whose price is not known

    @property
    def delta(self) -> float:
        return self.after - self.before

    @property
    def changed(self) -> bool:
        return bool(self.lines or self.unpriced)

    def text_lines(self) -> tuple[str, ...]:
        out = [line.text() for line in self.lines]
        out += [f"? {box}: price not known (not in the listings given)" for box in self.unpriced]
        out.append(f"fleet: {money(self.before)} -> {money(self.after)} ({money(self.delta, sign=True)})")
        return tuple(out)

    def as_json(self) -> dict[str, JSON]:
        return {"before_per_hour": round(self.before, 4), "after_per_hour": round(self.after, 4),
                "delta_per_hour": round(self.delta, 4),
                "lines": [{"delta_per_hour": round(line.delta, 4), "gpus": line.gpus, "gpu": line.gpu,
                           "provider": str(line.provider), "boxes": list(line.boxes), "at_most": line.at_most,
                           "text": line.text()} for line in self.lines],
                "unpriced": list(self.unpriced)}


def _group(prices: Iterable[BoxPrice], sign: int) -> list[CostLine]:
    groups: dict[tuple[Provider, str, bool], list[BoxPrice]] = {}
    for price in prices:
        groups.setdefault((price.provider, price.gpu, price.source is PriceSource.CEILING), []).append(price)
    return [CostLine(sign * sum(p.per_hour for p in group), sum(p.gpus or 1 for p in group), gpu, provider,
                     tuple(sorted(p.box for p in group)), at_most)
            for (provider, gpu, at_most), group in sorted(groups.items())]


def pool_unit_price(pool: Pool, prices: Mapping[str, BoxPrice]) -> tuple[float, bool]:
    """(USD per hour of one box of the pool, whether that is only its ceiling): a rental of the pool that `prices`
    has (its listing, or the offer a plan would rent: keyed by its label fleetllm-POOL-N), else the pool's
    max_per_hour, "at most"."""
    prefix = f"fleetllm-{pool.name}-"
    found = sorted(p.per_hour for name, p in prices.items()
                   if name.startswith(prefix) and name[len(prefix):].isdigit() and p.provider is pool.provider)
    return (found[-1], False) if found else (pool.max_per_hour, True)


def _pool_lines(base: Fleet, head: Fleet, prices: Mapping[str, BoxPrice]) -> list[CostLine]:
    """What a change of fleet.yaml `capacity.pools` does to the cost: boxes a pool will rent (+) or terminate (-)."""
    old = base.settings.capacity.pools if base.settings.capacity is not None else {}
    new = head.settings.capacity.pools if head.settings.capacity is not None else {}
    lines: list[CostLine] = []
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name), new.get(name)
        same = before is not None and after is not None and \
            (before.provider, before.gpu, before.gpus) == (after.provider, after.gpu, after.gpus)
        sides = [(after, after.count - before.count)] if same and after is not None and before is not None else \
            [(p, sign * p.count) for p, sign in ((after, 1), (before, -1)) if p is not None]
        for pool, boxes in sides:
            if boxes == 0:
                continue
            unit, at_most = pool_unit_price(pool, prices)
            lines.append(CostLine(boxes * unit, abs(boxes) * pool.gpus, pool.gpu, pool.provider,
                                  (f"pool {name}, {abs(boxes)} box{'es' * (abs(boxes) != 1)}",), at_most))
    return lines


def cost_change(base: Fleet, head: Fleet, prices: Mapping[str, BoxPrice]) -> CostChange:
    """What merging HEAD over BASE changes in the fleet's cost: the boxes it adds (+) and removes (-) from the
    placement, each kind of capacity on one line, and the boxes its capacity pools will rent or terminate (at
    their offer's or listing's price, else "at most" their max_per_hour); the fleet's total before and after.
    A pool's rentals already placed are priced once, as placed boxes."""
    before = fleet_cost(base, prices)
    after = fleet_cost(head, prices)
    added = [after.boxes[b] for b in sorted(set(after.boxes) - set(before.boxes))]
    removed = [before.boxes[b] for b in sorted(set(before.boxes) - set(after.boxes))]
    unpriced = sorted((set(after.unpriced) ^ set(before.unpriced)) - set(after.boxes) - set(before.boxes))
    pools = _pool_lines(base, head, prices)
    return CostChange((*_group(added, 1), *_group(removed, -1), *pools), before.total,
                      after.total + sum(line.delta for line in pools), tuple(unpriced))
