"""Capacity declared in git: which boxes to rent and which to terminate, and at what price. Pure.

fleet.yaml's `capacity:` (opt-in; schemas/fleet.schema.json has every field and default) declares pools
of rented boxes by provider: the GPU type, how many boxes, the most one box may cost per hour, the image
or template to boot, the regions allowed; and fleet-wide valves: the most the whole fleet may cost per
hour, at most N rentals and N terminations per pass.

A rented box belongs to a pool by its label at the provider (`fleetllm-POOL-N`: RunPod's pod `name`,
Vast's instance `label`), so the provider's listing is the truth about what is rented; nothing without
such a label is ever terminated. The label is also the box's name in the fleet: it is rented with LLMAO_HOST
set to it, so the commit that declares the pool places its boxes by label and they are approved by it
(fleetllm.adapters.providers lists a rental under its label); `RentedBox.names` holds both that and the
provider's name (a box approved by hand under its pod id or IP).

`plan_capacity` decides, from the declaration, what is rented (with prices), the offers found, the placement
and which boxes have retired:

- a pool with fewer boxes than declared rents the cheapest offer at or under its `max_per_hour`, while
  the fleet stays at or under `max_fleet_per_hour` and the pass's rental budget lasts;
- a box of a pool removed (or beyond its count) is terminated only when it is *retired*: absent from the
  placement, with no server intended on it, and reported empty by its agent (issue 25 item 1: the
  `retired` set the caller passes); never while it still serves a model's last serving server; at most
  the pass's termination budget;
- everything not done is *held*, with why (no offer under the price, the fleet ceiling, a budget, a box
  still placed or not retired yet).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from fleetllm.core.cost import BoxPrice, PriceSource, money
from fleetllm.core.fleet.jsonvalue import JSON
from fleetllm.core.fleet.model import CapacitySettings, Pool, Provider
from fleetllm.core.judge.intended import Intended, ServerKey
from fleetllm.core.judge.observed import BoxFacts, ProviderListing
from fleetllm.core.judge.verdict import SERVING, Judgement

LABEL_PREFIX = "fleetllm-"


def pool_label(pool: str, index: int) -> str:
    """The label a rental of `pool` carries at its provider (RunPod pod name, Vast instance label)."""
    return f"{LABEL_PREFIX}{pool}-{index}"


def label_pool(label: str, pools: Iterable[str]) -> str | None:
    """The pool a label names (the longest pool name that fits `fleetllm-POOL-N`), else None."""
    if not label.startswith(LABEL_PREFIX):
        return None
    rest = label[len(LABEL_PREFIX):]
    head, _, index = rest.rpartition("-")
    if not index.isdigit():
        return None
    return head if head in set(pools) else None


@dataclass(frozen=True)
class Offer:
    """Capacity a provider would rent now: a Vast ask, or a RunPod GPU type in a data center."""

    provider: Provider
    ask: str  # Vast: the ask (offer) id to accept; RunPod: the GPU type id to create a pod with
    gpu: str
    gpus: int
    per_hour: float
    region: str = ""


@dataclass(frozen=True)
class RentRequest:
    """What the adapter sends to rent one box of a pool."""

    pool: str
    label: str
    provider: Provider
    gpu: str
    gpus: int
    ask: str
    max_per_hour: float
    image: str | None = None
    template: str | None = None
    regions: tuple[str, ...] = ()
    disk_gb: int | None = None


@dataclass(frozen=True)
class RentedBox:
    """A rented box as the provider lists it, with the pool its label names."""

    provider: Provider
    ident: str  # RunPod pod id, Vast instance (contract) id: what terminate takes
    box: str | None  # its name in the placement: RunPod's pod id; Vast's public IP (None until it has one)
    label: str
    pool: str | None  # None: its label names no declared pool (a pool removed from git)
    per_hour: float | None = None
    gpu: str = ""
    gpus: int | None = None

    @property
    def names(self) -> frozenset[str]:
        """The names the fleet may know it by: its label (what it presents itself as, rented with LLMAO_HOST set
        to it, and how the declaring commit places it) and its provider's name (a box approved by hand)."""
        return frozenset(name for name in (self.label, self.box) if name)


@dataclass(frozen=True)
class Rental:
    request: RentRequest
    offer: Offer

    @property
    def price(self) -> BoxPrice:
        return BoxPrice(self.request.label, self.offer.provider, self.offer.per_hour, self.offer.gpu,
                        self.offer.gpus, PriceSource.OFFER)

    def line(self) -> str:
        where = f" in {self.offer.region}" if self.offer.region else ""
        return (f"+ rent {self.price.what()}{where} for pool {self.request.pool} as {self.request.label}: "
                f"{money(self.offer.per_hour, sign=True)}")


@dataclass(frozen=True)
class Termination:
    box: RentedBox
    reason: str

    def line(self) -> str:
        price = money(-(self.box.per_hour or 0.0), sign=True) if self.box.per_hour is not None else "price unknown"
        name = self.box.box or self.box.label
        return f"- terminate {self.box.provider} {self.box.ident} ({name}, {self.reason}): {price}"


@dataclass(frozen=True)
class Held:
    what: str
    reason: str

    def line(self) -> str:
        return f"  held {self.what}: {self.reason}"


@dataclass(frozen=True)
class CapacityPlan:
    rentals: tuple[Rental, ...] = ()
    terminations: tuple[Termination, ...] = ()
    held: tuple[Held, ...] = ()
    before_per_hour: float = 0.0  # the rented boxes' sum now
    after_per_hour: float = 0.0  # after the rentals and terminations
    rented: tuple[RentedBox, ...] = ()  # the labelled rentals the listings show
    listed: frozenset[Provider] = frozenset()  # the providers whose listing was read (the rest are unknown)

    @property
    def empty(self) -> bool:
        return not self.rentals and not self.terminations

    def as_json(self) -> dict[str, JSON]:
        """The plan document's `capacity` (fleetllm plan --format json / --out)."""
        return {"rentals": [{"pool": r.request.pool, "label": r.request.label, "provider": str(r.offer.provider),
                             "ask": r.offer.ask, "gpu": r.offer.gpu, "gpus": r.offer.gpus, "region": r.offer.region,
                             "per_hour": r.offer.per_hour} for r in self.rentals],
                "terminations": [{"provider": str(t.box.provider), "id": t.box.ident, "box": t.box.box,
                                  "label": t.box.label, "per_hour": t.box.per_hour, "reason": t.reason}
                                 for t in self.terminations],
                "held": [{"what": h.what, "reason": h.reason} for h in self.held],
                "before_per_hour": self.before_per_hour, "after_per_hour": self.after_per_hour}

    def lines(self) -> tuple[str, ...]:
        """Terraform-like: what is rented (+) and terminated (-) with each price, what is held, the total."""
        out = [r.line() for r in self.rentals] + [t.line() for t in self.terminations] + [h.line() for h in self.held]
        out.append(f"Capacity: {len(self.rentals)} to rent, {len(self.terminations)} to terminate; rented boxes "
                   f"{money(self.before_per_hour)} -> {money(self.after_per_hour)}")
        return tuple(out)


def _next_index(pool: str, taken: Iterable[str]) -> int:
    used = {int(label.rsplit("-", 1)[1]) for label in taken if label_pool(label, (pool,)) == pool}
    index = 1
    while index in used:
        index += 1
    return index


def _cheapest(pool: Pool, offers: Iterable[Offer], used: set[str]) -> Offer | None:
    fitting = [o for o in offers if o.provider is pool.provider and o.gpus >= pool.gpus
               and o.per_hour <= pool.max_per_hour and (not pool.regions or o.region in pool.regions)
               and (o.provider is Provider.RUNPOD or o.ask not in used)]  # a Vast ask rents once
    return min(fitting, key=lambda o: (o.per_hour, o.ask), default=None)


def plan_capacity(settings: CapacitySettings, rented: Iterable[RentedBox], offers: Mapping[str, Iterable[Offer]],
                  *, placed: frozenset[str], retired: frozenset[str],
                  last_servers: Mapping[str, frozenset[str]], others_per_hour: float = 0.0) -> CapacityPlan:
    """What to rent and terminate this pass.

    `rented`: the boxes the providers list with a fleetllm label; `offers`: per pool, what could be rented;
    `placed`: the boxes of the placement (HEAD); `retired`: boxes absent from the placement that reported
    empty (their servers stopped); `last_servers`: per model, the boxes that still serve it (a box that is
    the only one for a model is never terminated); `others_per_hour`: what the fleet's other priced boxes (placed,
    not rented by a pool) cost, counted against max_fleet_per_hour with the pools' rentals."""
    boxes = list(rented)
    live = [b for b in boxes if b.pool is not None and b.pool in settings.pools]
    orphans = [b for b in boxes if b.pool is None or b.pool not in settings.pools]
    total = others_per_hour + sum(b.per_hour or 0.0 for b in boxes)
    before = total
    rentals: list[Rental] = []
    terminations: list[Termination] = []
    held: list[Held] = []
    labels = [b.label for b in boxes]
    used_asks: set[str] = set()
    for name, pool in sorted(settings.pools.items()):
        have = [b for b in live if b.pool == name]
        for _ in range(pool.count - len(have)):
            index = _next_index(name, labels)
            label = pool_label(name, index)
            what = f"rent {label} ({pool.gpus} × {pool.gpu} on {pool.provider})"
            offer = _cheapest(pool, offers.get(name, ()), used_asks)
            if offer is None:
                held.append(Held(what, f"no offer at or under {money(pool.max_per_hour)} per box"
                                       + (f" in {', '.join(pool.regions)}" if pool.regions else "")))
                continue
            if total + offer.per_hour > settings.max_fleet_per_hour + 1e-9:
                held.append(Held(what, f"the fleet would cost {money(total + offer.per_hour)}, over capacity."
                                       f"max_fleet_per_hour {money(settings.max_fleet_per_hour)}"))
                continue
            if len(rentals) >= settings.max_rentals_per_pass:
                held.append(Held(what, f"max_rentals_per_pass ({settings.max_rentals_per_pass}) reached: next pass"))
                continue
            labels.append(label)
            used_asks.add(offer.ask)
            total += offer.per_hour
            rentals.append(Rental(RentRequest(name, label, pool.provider, offer.gpu, pool.gpus, offer.ask,
                                              pool.max_per_hour, pool.image, pool.template, pool.regions,
                                              pool.disk_gb), offer))
        extra = len(have) - pool.count
        if extra > 0:  # the unplaced first, the newest (highest index) first among equals
            ranked = sorted(have, key=lambda b: (bool(b.names & placed), -int(b.label.rsplit("-", 1)[1])))
            orphans.extend(ranked[:extra])
    for box in sorted(orphans, key=lambda b: b.label):
        why = "its pool is no longer declared" if box.pool is None or box.pool not in settings.pools else \
            f"pool {box.pool} declares fewer boxes"
        what = f"terminate {box.provider} {box.ident} ({box.box or box.label})"
        only = sorted(model for model, serving in last_servers.items() if serving and serving <= box.names)
        if box.names & placed:
            held.append(Held(what, f"{why}, but placement.yaml still places it: remove its servers first"))
        elif only:
            held.append(Held(what, f"{why}, but it still serves the last server of {', '.join(only)}"))
        elif box.box is not None and not box.names & retired:
            held.append(Held(what, f"{why}; waiting for it to retire (its servers stopped, reported empty)"))
        elif len(terminations) >= settings.max_terminations_per_pass:
            held.append(Held(what, f"max_terminations_per_pass ({settings.max_terminations_per_pass}) reached: "
                                   "next pass"))
        else:
            terminations.append(Termination(box, why))
            total -= box.per_hour or 0.0
    return CapacityPlan(tuple(rentals), tuple(terminations), tuple(held), round(before, 4), round(total, 4),
                        tuple(boxes))


def rented_boxes(listings: Iterable[ProviderListing], pools: Iterable[str]) -> list[RentedBox]:
    """Every labelled rental of the listings, with the pool its label names (None: a pool no longer declared)."""
    names = tuple(pools)
    out = []
    for listing in listings:
        for ident, box in sorted(listing.rentals.items()):
            out.append(RentedBox(listing.provider, ident, box.box or None, box.label, label_pool(box.label, names),
                                 box.price, box.gpu, box.gpus))
    return out


def retired_boxes(facts: Mapping[str, BoxFacts], placed: Iterable[str], intended: Iterable[str]) -> frozenset[str]:
    """The boxes that have retired: absent from the placement, with no server in the intended state, and whose
    latest report says it installed nothing (the empty box JSON a retiring box is served, issue 25 item 1). Until
    a removed box is served that empty config and reports so, it is not retired, and nothing terminates it."""
    gone = set(placed) | set(intended)
    return frozenset(box for box, fact in facts.items()
                     if box not in gone and fact.report is not None and fact.report.runs_nothing())


def serving_boxes(intended: Intended, judgements: Mapping[ServerKey, Judgement]) -> dict[str, frozenset[str]]:
    """Per model, the boxes whose server of it was judged serving (Healthy or Stale) in the pass."""
    found: dict[str, set[str]] = {}
    for key, judgement in judgements.items():
        server = intended.servers.get(key)
        if server is not None and judgement.verdict in SERVING:
            found.setdefault(server.model, set()).add(server.box)
    return {model: frozenset(boxes) for model, boxes in found.items()}


BACKOFF_BASE_S = 60.0  # a failed rental or termination waits 1 min, then 2, 4, ... (the reconcile loop)
BACKOFF_MAX_S = 3600.0


@dataclass(frozen=True)
class Attempts:
    """Failed rentals and terminations by key (a rental's label, a termination's provider:id): how many failed in
    a row, when the last did, and why. A key is tried again BACKOFF_BASE_S × 2^(failures-1) after its last
    failure (at most BACKOFF_MAX_S); a success forgets it."""

    failures: Mapping[str, tuple[int, float, str]] = field(default_factory=dict)

    def due(self, key: str, now: float) -> bool:
        entry = self.failures.get(key)
        return entry is None or now >= entry[1] + self.wait_s(entry[0])

    @staticmethod
    def wait_s(failures: int) -> float:
        return min(BACKOFF_MAX_S, BACKOFF_BASE_S * float(2 ** max(0, failures - 1)))

    def failed(self, key: str, now: float, why: str) -> Attempts:
        count = self.failures.get(key, (0, 0.0, ""))[0] + 1
        return Attempts({**self.failures, key: (count, now, why)})

    def succeeded(self, key: str) -> Attempts:
        return Attempts({k: v for k, v in self.failures.items() if k != key})

    def due_plan(self, plan: CapacityPlan, now: float) -> CapacityPlan:
        """The plan without what is still backing off (held, with when it is tried again)."""
        def later(key: str) -> str:
            count, at, why = self.failures[key]
            return f"failed {count} time(s), last: {why}; tried again at +{int(at + self.wait_s(count) - now)}s"

        rentals = tuple(r for r in plan.rentals if self.due(rental_key(r), now))
        terminations = tuple(t for t in plan.terminations if self.due(termination_key(t), now))
        held = [Held(r.line(), later(rental_key(r))) for r in plan.rentals if r not in rentals]
        held += [Held(t.line(), later(termination_key(t))) for t in plan.terminations if t not in terminations]
        return replace(plan, rentals=rentals, terminations=terminations, held=(*plan.held, *held))


def rental_key(rental: Rental) -> str:
    return rental.request.label


def termination_key(termination: Termination) -> str:
    return f"{termination.box.provider}:{termination.box.ident}"


SLOW_RENTAL_S = 1800.0  # a rental whose box has neither fetched its config nor reported after this is slow


@dataclass(frozen=True)
class RentalWait:
    """A box the reconcile loop rented that has not presented itself yet (kept in the state store)."""

    label: str
    provider: Provider
    ident: str
    rented_at: float


@dataclass(frozen=True)
class CapacityIssue:
    """A rental or termination that needs a person: failing (backing off) or slow (rented, never heard of)."""

    kind: str  # failing | slow
    subject: str  # the rental's label, or a termination's provider:id
    text: str


def waiting(waits: Mapping[str, RentalWait], listed: Iterable[str], heard: Iterable[str]) -> dict[str, RentalWait]:
    """The rentals still waiting: listed by their provider (`listed`: the rentals' labels) and not `heard` of (no
    box of that label, nor of its provider id (a RunPod pod approved by hand under it), has fetched its config or
    reported)."""
    known, seen = set(listed), set(heard)
    return {label: wait for label, wait in waits.items()
            if label in known and label not in seen and wait.ident not in seen}


def capacity_issues(attempts: Attempts, waits: Mapping[str, RentalWait], now: float) -> tuple[CapacityIssue, ...]:
    """What the attention list shows of capacity: each key backing off after a failure, with when it is tried again,
    and each rental still unheard of SLOW_RENTAL_S after it was rented (its pod or instance may not boot: look at it
    at the provider, or lower the pool's count to give it back)."""
    failing = [CapacityIssue("failing", key, f"{'rent' if ':' not in key else 'terminate'} {key} failed {count} "
                                             f"time(s), last at {int(now - at)} s ago: {why}; tried again in "
                                             f"{max(0, int(at + Attempts.wait_s(count) - now))} s")
               for key, (count, at, why) in sorted(attempts.failures.items())]
    slow = [CapacityIssue("slow", label, f"{label} ({wait.provider} {wait.ident}) was rented "
                                         f"{int(now - wait.rented_at)} s ago and has not fetched its config: it may "
                                         f"not boot; look at it at {wait.provider}, or lower its pool's count to give "
                                         "it back")
            for label, wait in sorted(waits.items()) if now - wait.rented_at >= SLOW_RENTAL_S]
    return (*failing, *slow)
