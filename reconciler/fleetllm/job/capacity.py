"""Capacity in a pass: list the pools' providers, search offers for the pools short of boxes, plan the rentals and
terminations (fleetllm.core.capacity.plan_capacity), and execute a plan that was shown.

Used by `fleetllm plan` (lists them with their price), `fleetllm apply` (lists them, asks, executes) and the
reconcile loop (CapacityLoop: executes after each pass that wrote, with back-off). Nothing
here runs without a `capacity:` declaration in fleet.yaml. A pool whose provider has no key configured, or whose
listing or offer search fails, rents and terminates nothing: a failed observation never spends money (the
rentals could not be counted, so a rental could be a second one).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

import aiohttp

from fleetllm.adapters.http import connector
from fleetllm.adapters.notify import Notifier
from fleetllm.adapters.providers import (
    ProviderAccess,
    RentalError,
    Rented,
    RunPodClient,
    RunPodRenter,
    VastClient,
    VastRenter,
)
from fleetllm.adapters.state.reconcile import ReconcileState
from fleetllm.core.capacity import (
    Attempts,
    CapacityPlan,
    Held,
    Offer,
    Rental,
    RentalWait,
    Termination,
    plan_capacity,
    rental_key,
    rented_boxes,
    retired_boxes,
    serving_boxes,
    termination_key,
    waiting,
)
from fleetllm.core.cost import fleet_cost
from fleetllm.core.fleet.model import Fleet, Provider
from fleetllm.core.judge.observed import ProviderListing, listing_prices
from fleetllm.core.notify import Event, EventKind
from fleetllm.job.engine import PassOutcome
from fleetllm.job.loop import LOG
from fleetllm.job.metrics import PassMetrics
from fleetllm.logs import log_event

Renter = VastRenter | RunPodRenter


def renter(provider: Provider, access: ProviderAccess) -> Renter:
    return VastRenter(access) if provider is Provider.VAST else RunPodRenter(access)


async def _listing(session: aiohttp.ClientSession, provider: Provider, access: ProviderAccess) -> ProviderListing:
    client = VastClient(access) if provider is Provider.VAST else RunPodClient(access)
    return await client.list(session)


async def plan_pass_capacity(fleet: Fleet, outcome: PassOutcome,
                             providers: Mapping[Provider, ProviderAccess]) -> CapacityPlan | None:
    """The capacity plan beside a pass's plan; None when fleet.yaml declares no capacity."""
    capacity = fleet.settings.capacity
    if capacity is None:
        return None
    wanted = {pool.provider for pool in capacity.pools.values()} | {
        p for p, listing in outcome.observation.listings.items() if listing.rentals}
    held: list[Held] = []
    listings: dict[Provider, ProviderListing] = {}
    offers: dict[str, list[Offer]] = {}
    async with aiohttp.ClientSession(connector=connector(limit=8)) as session:
        for provider in sorted(wanted):
            access = providers.get(provider)
            if access is None:
                held.append(Held(f"capacity on {provider}", f"no {provider} key configured (providers.{provider}): "
                                                            "nothing is rented or terminated there"))
                continue
            listing = outcome.observation.listings.get(provider) or await _listing(session, provider, access)
            if not listing.ok:
                held.append(Held(f"capacity on {provider}", f"the {provider} listing failed ({listing.error}): "
                                                            "nothing is rented or terminated there this pass"))
                continue
            listings[provider] = listing
        rented = rented_boxes(listings.values(), capacity.pools)
        for name, pool in sorted(capacity.pools.items()):
            have = sum(1 for box in rented if box.pool == name)
            if pool.provider not in listings or have >= pool.count:
                continue
            access = providers[pool.provider]
            try:
                offers[name] = await renter(pool.provider, access).offers(session, pool)
            except RentalError as exc:
                held.append(Held(f"rent for pool {name}", f"the offer search failed ({exc})"))
                offers[name] = []
    pools_seen = {name: pool for name, pool in capacity.pools.items() if pool.provider in listings}
    pooled = {name for box in rented for name in box.names}
    placed_cost = fleet_cost(fleet, listing_prices(outcome.observation.listings))
    others = sum(p.per_hour for name, p in placed_cost.boxes.items() if name not in pooled)
    plan = plan_capacity(replace(capacity, pools=pools_seen), rented, offers, placed=frozenset(fleet.boxes),
                         retired=retired_boxes(outcome.observation.boxes, fleet.boxes,
                                               {s.box for s in outcome.intended.servers.values()}),
                         last_servers=serving_boxes(outcome.intended, outcome.plan.judgements), others_per_hour=others)
    # a pool whose provider could not be listed is left as it is (its boxes are not orphans): held above
    orphaned = {t for t in plan.terminations if t.box.pool is not None and t.box.pool in capacity.pools
                and t.box.pool not in pools_seen}
    return replace(plan, terminations=tuple(t for t in plan.terminations if t not in orphaned),
                   held=(*held, *plan.held), listed=frozenset(listings))


def signature(plan: CapacityPlan) -> tuple[tuple[str, ...], ...]:
    """What a shown plan is held to: the labels rented (with the offer) and the boxes terminated."""
    return (tuple(f"{r.request.label}@{r.offer.ask}" for r in plan.rentals),
            tuple(f"{t.box.provider}:{t.box.ident}" for t in plan.terminations))


@dataclass(frozen=True)
class CapacityResult:
    what: str
    ok: bool
    detail: str = ""
    rented: Rented | None = None

    def line(self) -> str:
        return f"  {'ok' if self.ok else 'FAILED':6} {self.what}{': ' + self.detail if self.detail else ''}"


async def execute_capacity(plan: CapacityPlan, providers: Mapping[Provider, ProviderAccess]) -> list[CapacityResult]:
    """Rent, then terminate, one at a time; a failure is reported and the rest still run (a rental is retried by
    the next pass that still finds its pool short: its label was never listed)."""
    async with aiohttp.ClientSession(connector=connector(limit=4)) as session:
        rented = [await _rent(session, r, providers[r.offer.provider]) for r in plan.rentals]
        return rented + [await _terminate(session, t, providers[t.box.provider]) for t in plan.terminations]


async def _rent(session: aiohttp.ClientSession, rental: Rental, access: ProviderAccess) -> CapacityResult:
    what = f"rent {rental.request.label} ({rental.offer.provider} {rental.offer.ask})"
    try:
        rented = await renter(rental.offer.provider, access).rent(session, rental.request)
    except RentalError as exc:
        return CapacityResult(what, False, str(exc))
    named = f"box {rented.box}" if rented.box else "unnamed"
    return CapacityResult(what, True, f"{rental.offer.provider} id {rented.ident}, {named}", rented)


async def _terminate(session: aiohttp.ClientSession, termination: Termination,
                     access: ProviderAccess) -> CapacityResult:
    box = termination.box
    what = f"terminate {box.provider} {box.ident} ({box.box or box.label})"
    try:
        await renter(box.provider, access).terminate(session, box.ident)
    except RentalError as exc:
        return CapacityResult(what, False, str(exc))
    return CapacityResult(what, True)


class CapacityLoop:
    """Capacity in the reconcile loop: after each pass that wrote (not a dry run, not suspended), plan the
    capacity again and execute what is due, with back-off on failures (fleetllm.core.capacity.Attempts). Each result
    is logged; failures count in `fleetllm_capacity_actions_total{result="failed"}` and `fleetllm_capacity_failing`
    (the alert to set). With a state store the back-off and the rentals not heard of yet are kept there (a restart
    keeps them; the status pages' attention list shows both: capacity_issues)."""

    def __init__(self, providers: Mapping[Provider, ProviderAccess], metrics: PassMetrics,
                 notifier: Notifier | None = None, store: ReconcileState | None = None) -> None:
        self.providers = providers
        self.metrics = metrics
        self.notifier = notifier  # capacity_failed: firing while a key backs off, resolved when it succeeds
        self.store = store
        self.attempts = store.capacity_attempts() if store is not None else Attempts()
        self.waits: dict[str, RentalWait] = store.rental_waits() if store is not None else {}

    async def step(self, fleet: Fleet, outcome: PassOutcome, now: float) -> list[CapacityResult]:
        try:
            return await self._step(fleet, outcome, now)
        finally:
            if self.store is not None:
                self.store.save_capacity(self.attempts, self.waits)

    def _heard(self) -> set[str]:
        """The boxes that fetched their config or reported (none without a store: then nothing is slow)."""
        if self.store is None:
            return set(self.waits)
        return {box for box, facts in self.store.box_facts().items()
                if facts.fetched_at is not None or facts.report is not None}

    async def _step(self, fleet: Fleet, outcome: PassOutcome, now: float) -> list[CapacityResult]:
        plan = await plan_pass_capacity(fleet, outcome, self.providers)
        planned = {rental_key(r) for r in plan.rentals} | {termination_key(t) for t in plan.terminations} \
            if plan is not None else set()
        self.attempts = Attempts({k: v for k, v in self.attempts.failures.items() if k in planned})  # gone: forgotten
        if plan is None:
            self.waits = {}
            self.settle()
            return []
        unknown = {label: w for label, w in self.waits.items() if w.provider not in plan.listed}  # kept as they are
        self.waits = {**waiting(self.waits, (b.label for b in plan.rented), self._heard()), **unknown}
        due = self.attempts.due_plan(plan, now)
        self.metrics.capacity_held.set(len(due.held))
        for held in due.held:
            log_event(LOG, "capacity_held", what=held.what, reason=held.reason)
        results = await execute_capacity(due, self.providers)
        keys = [rental_key(r) for r in due.rentals] + [termination_key(t) for t in due.terminations]
        for key, result in zip(keys, results, strict=True):
            kind = "rent" if result.what.startswith("rent") else "terminate"
            self.metrics.capacity_actions.labels(kind, "ok" if result.ok else "failed").inc()
            if result.ok:
                self.attempts = self.attempts.succeeded(key)
                if result.rented is not None and kind == "rent":
                    rental = next(r for r in due.rentals if rental_key(r) == key)
                    self.waits[key] = RentalWait(key, rental.offer.provider, result.rented.ident, now)
                log_event(LOG, "capacity_done", what=result.what, detail=result.detail)
            else:
                self.attempts = self.attempts.failed(key, now, result.detail)
                log_event(LOG, "capacity_failed", logging.WARNING, what=result.what, error=result.detail,
                          retry_in_s=Attempts.wait_s(self.attempts.failures[key][0]))
        self.metrics.capacity_failing.set(len(self.attempts.failures))
        self.settle()
        return results

    def settle(self) -> None:
        if self.notifier is None:
            return
        self.notifier.settle(EventKind.CAPACITY_FAILED, [
            Event(EventKind.CAPACITY_FAILED, key, f"{key}: failed {count} time(s), tried again after a back-off: {why}",
                  details={"failures": count, "last_failed_at": at, "error": why})
            for key, (count, at, why) in sorted(self.attempts.failures.items())])
