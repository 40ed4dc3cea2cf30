"""Capacity declared in git (fleet.yaml `capacity:`) and the pure planner of rentals and terminations
(fleetllm.core.capacity): prices under the valves, and never a termination of a box still placed, still serving a
model's last server, or not retired yet."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fleetllm.core.capacity import (
    Attempts,
    CapacityPlan,
    Offer,
    RentedBox,
    label_pool,
    plan_capacity,
    pool_label,
)
from fleetllm.core.fleet.model import CapacitySettings, Pool, Provider, frozen_map
from tests.fleet.helpers import FLEET, validate

H100 = "NVIDIA H100 80GB HBM3"
CAPACITY = FLEET + """\
capacity:
  max_fleet_per_hour: 10
  max_rentals_per_pass: 2
  pools:
    h100:
      provider: runpod
      gpu: NVIDIA H100 80GB HBM3
      gpus: 1
      count: 2
      max_per_hour: 3.0
      template: tmpl-fleetllm
      regions: [US-KS-2, EU-RO-1]
    a100:
      provider: vast
      gpu: A100 SXM4
      gpus: 1
      count: 1
      max_per_hour: 1.5
      image: vastai/vllm:v0.11.0
      template: 4e17788f74f075dd9aab7d0d4427968f
      disk_gb: 120
"""


def test_a_declaration_builds_with_the_schemas_defaults() -> None:
    validation = validate(fleet=CAPACITY)
    assert validation.fleet is not None, [d.text() for d in validation.diagnostics]
    capacity = validation.fleet.settings.capacity
    assert capacity is not None
    assert (capacity.max_fleet_per_hour, capacity.max_rentals_per_pass, capacity.max_terminations_per_pass) == \
        (10.0, 2, 1)
    assert capacity.pools["h100"] == Pool("h100", Provider.RUNPOD, H100, 1, 2, 3.0, None, "tmpl-fleetllm",
                                          ("US-KS-2", "EU-RO-1"))
    assert capacity.pools["a100"].image == "vastai/vllm:v0.11.0" and capacity.pools["a100"].disk_gb == 120
    assert validate().fleet is not None and validate().fleet.settings.capacity is None  # type: ignore[union-attr]


@pytest.mark.parametrize(("edit", "field"), [
    (("  max_fleet_per_hour: 10\n", ""), "max_fleet_per_hour"),  # no ceiling, no rentals: it has no default
    (("      image: vastai/vllm:v0.11.0\n", ""), "image"),  # Vast needs an image
    (("      template: tmpl-fleetllm\n", ""), "template"),  # the template carries the fleet key: required
    (("    h100:\n", "    H100_pool:\n"), "H100_pool"),
    (("      max_per_hour: 3.0\n", "      max_per_hour: 0\n"), "max_per_hour"),
    (("      provider: runpod\n", "      provider: static\n"), "provider"),
    (("      gpus: 1\n      count: 2\n", "      count: 2\n"), "gpus"),  # stated, never assumed
    (("      template: tmpl-fleetllm\n", "      template: \"tmpl\\nx\"\n"), "template"),
])
def test_a_declaration_that_is_not_one_is_refused_naming_the_field(edit: tuple[str, str], field: str) -> None:
    assert edit[0] in CAPACITY
    validation = validate(fleet=CAPACITY.replace(*edit, 1))
    assert validation.fleet is None
    texts = " ".join(d.text() for d in validation.diagnostics)
    assert "fleet.yaml" in texts and field in texts, texts


def settings(count: int = 2, ceiling: float = 10.0, rentals: int = 2, terminations: int = 1,
             regions: tuple[str, ...] = ()) -> CapacitySettings:
    pool = Pool("h100", Provider.RUNPOD, H100, 1, count, 3.0, template="t", regions=regions)
    return CapacitySettings(ceiling, frozen_map({"h100": pool}), rentals, terminations)


def pod(index: int, box: str | None = None, price: float = 2.69, pool: str | None = "h100") -> RentedBox:
    name = box or f"pod{index}"
    return RentedBox(Provider.RUNPOD, name, name, pool_label("h100", index), pool, price, "H100 80GB HBM3", 1)


OFFERS = {"h100": [Offer(Provider.RUNPOD, H100, "H100 SXM", 1, 2.69, "US-KS-2"),
                   Offer(Provider.RUNPOD, H100, "H100 SXM", 1, 3.49, "US-KS-2")]}
NONE: frozenset[str] = frozenset()


def test_labels_name_their_pool() -> None:
    assert pool_label("h100", 3) == "fleetllm-h100-3"
    assert label_pool("fleetllm-h100-3", ["h100", "a100"]) == "h100"
    assert label_pool("fleetllm-h100-pool-12", ["h100", "h100-pool"]) == "h100-pool"
    for other in ("my-pod", "fleetllm-h100", "fleetllm-h100-x", "fleetllm-gone-1"):
        assert label_pool(other, ["h100"]) is None, other


def test_a_pool_short_of_its_count_rents_the_cheapest_offer_under_its_price() -> None:
    plan = plan_capacity(settings(), [pod(1)], OFFERS, placed=frozenset({"pod1"}), retired=NONE, last_servers={})
    [rental] = plan.rentals
    assert (rental.request.label, rental.offer.per_hour, rental.request.template) == ("fleetllm-h100-2", 2.69, "t")
    assert plan.terminations == () and plan.held == ()
    assert (plan.before_per_hour, plan.after_per_hour) == (2.69, 5.38)
    assert plan.lines()[0] == "+ rent 1 × H100 SXM on RunPod in US-KS-2 for pool h100 as fleetllm-h100-2: +$2.69/h"
    assert plan.lines()[-1] == "Capacity: 1 to rent, 0 to terminate; rented boxes $2.69/h -> $5.38/h"


def test_no_offer_at_or_under_the_price_rents_nothing_and_says_why() -> None:
    dear = {"h100": [Offer(Provider.RUNPOD, H100, "H100 SXM", 1, 3.49)]}
    plan = plan_capacity(settings(count=1), [], dear, placed=NONE, retired=NONE, last_servers={})
    assert plan.rentals == () and "no offer at or under $3.00/h per box" in plan.held[0].reason
    in_region = plan_capacity(settings(count=1, regions=("EU-RO-1",)), [], OFFERS, placed=NONE, retired=NONE,
                              last_servers={})
    assert in_region.rentals == () and "in EU-RO-1" in in_region.held[0].reason


def test_the_fleet_ceiling_and_the_rental_budget_hold_rentals() -> None:
    ceiling = plan_capacity(settings(count=3, ceiling=6.0), [pod(1)], OFFERS, placed=NONE, retired=NONE,
                            last_servers={})
    assert len(ceiling.rentals) == 1 and len(ceiling.held) == 1
    assert "the fleet would cost $8.07/h, over capacity.max_fleet_per_hour $6.00/h" in ceiling.held[0].reason
    others = plan_capacity(settings(count=1, ceiling=6.0), [], OFFERS, placed=NONE, retired=NONE, last_servers={},
                           others_per_hour=4.0)  # the fleet's boxes rented by hand count against the ceiling too
    assert others.rentals == () and "the fleet would cost $6.69/h" in others.held[0].reason
    assert others.before_per_hour == 4.0
    budget = plan_capacity(settings(count=3, rentals=1), [], OFFERS, placed=NONE, retired=NONE, last_servers={})
    assert len(budget.rentals) == 1 and [h.reason for h in budget.held] == \
        ["max_rentals_per_pass (1) reached: next pass"] * 2
    zero = plan_capacity(settings(rentals=0), [], OFFERS, placed=NONE, retired=NONE, last_servers={})
    assert zero.rentals == () and len(zero.held) == 2


def test_a_box_beyond_the_count_is_terminated_only_once_retired() -> None:
    boxes = [pod(1), pod(2)]
    placed = plan_capacity(settings(count=1), boxes, {}, placed=frozenset({"pod1", "pod2"}), retired=NONE,
                           last_servers={})
    assert placed.terminations == () and "placement.yaml still places it" in placed.held[0].reason
    waiting = plan_capacity(settings(count=1), boxes, {}, placed=frozenset({"pod1"}), retired=NONE,
                            last_servers={})
    assert waiting.terminations == () and "waiting for it to retire" in waiting.held[0].reason
    done = plan_capacity(settings(count=1), boxes, {}, placed=frozenset({"pod1"}), retired=frozenset({"pod2"}),
                         last_servers={})
    [termination] = done.terminations
    assert termination.box.ident == "pod2" and done.after_per_hour == 2.69
    assert termination.line() == "- terminate runpod pod2 (pod2, pool h100 declares fewer boxes): -$2.69/h"


def test_a_rental_placed_by_its_label_is_approved_by_that_placement() -> None:
    """Issue 25: a rental presents itself under its label (LLMAO_HOST), so the commit that declares its pool places
    it by that label. Placed, serving or retired by label is placed, serving or retired: the box's pod id plays
    no part (it is still honoured for a box approved by hand under it)."""
    boxes = [pod(1), pod(2)]
    label = pool_label("h100", 2)
    assert boxes[1].names == {"pod2", label}
    placed = plan_capacity(settings(count=1), boxes, {}, placed=frozenset({"pod1", label}), retired=NONE,
                           last_servers={})
    assert placed.terminations == () and "placement.yaml still places it" in placed.held[0].reason
    last = plan_capacity(settings(count=1), boxes, {}, placed=frozenset({"pod1"}), retired=frozenset({label}),
                         last_servers={"qwen": frozenset({label})})
    assert last.terminations == () and "still serves the last server of qwen" in last.held[0].reason
    done = plan_capacity(settings(count=1), boxes, {}, placed=frozenset({"pod1"}), retired=frozenset({label}),
                         last_servers={"qwen": frozenset({label, "pod1"})})
    assert [t.box.ident for t in done.terminations] == ["pod2"]
    # a pool's box count counts rentals, not names: the one placed by label is the one kept
    ranked = plan_capacity(settings(count=1), boxes, {}, placed=frozenset({label}), retired=frozenset({"pod1"}),
                           last_servers={})
    assert [t.box.ident for t in ranked.terminations] == ["pod1"]


def test_never_the_last_server_of_a_model() -> None:
    plan = plan_capacity(settings(count=0), [pod(1)], {}, placed=NONE, retired=frozenset({"pod1"}),
                         last_servers={"qwen": frozenset({"pod1"}), "llama": frozenset({"pod1", "x"})})
    assert plan.terminations == () and "still serves the last server of qwen" in plan.held[0].reason


def test_a_removed_pool_is_terminated_under_the_budget_and_unlabelled_boxes_never() -> None:
    gone = [pod(i, pool=None) for i in (1, 2, 3)]
    plan = plan_capacity(CapacitySettings(10.0, frozen_map({}), 1, 2), gone, {}, placed=NONE,
                         retired=frozenset({"pod1", "pod2", "pod3"}), last_servers={})
    assert [t.box.ident for t in plan.terminations] == ["pod1", "pod2"]
    assert plan.terminations[0].reason == "its pool is no longer declared"
    assert "max_terminations_per_pass (2) reached" in plan.held[0].reason
    # a Vast rental still loading (no public IP, so never placed, never served) needs no retirement
    loading = RentedBox(Provider.VAST, "9000001", None, "fleetllm-old-1", None, 1.2)
    assert plan_capacity(CapacitySettings(10.0, frozen_map({}), 1, 1), [loading], {}, placed=NONE, retired=NONE,
                         last_servers={}).terminations[0].box == loading


def test_a_vast_ask_is_rented_once_in_a_pass() -> None:
    pool = Pool("a100", Provider.VAST, "A100", 1, 2, 1.5, image="i")
    offers = {"a100": [Offer(Provider.VAST, "11", "A100", 1, 1.2), Offer(Provider.VAST, "12", "A100", 1, 1.3)]}
    plan = plan_capacity(CapacitySettings(10.0, frozen_map({"a100": pool}), 2, 1), [], offers, placed=NONE,
                         retired=NONE, last_servers={})
    assert [r.offer.ask for r in plan.rentals] == ["11", "12"]
    assert [r.request.label for r in plan.rentals] == ["fleetllm-a100-1", "fleetllm-a100-2"]


def test_a_failure_backs_off_doubling_and_a_success_forgets_it() -> None:
    plan = plan_capacity(settings(count=1), [], OFFERS, placed=NONE, retired=NONE, last_servers={})
    attempts = Attempts()
    assert attempts.due_plan(plan, 0.0) == plan
    attempts = attempts.failed("fleetllm-h100-1", 100.0, "RunPod POST /v2/pods: HTTP 500")
    held = attempts.due_plan(plan, 130.0)
    assert held.rentals == () and "failed 1 time(s), last: RunPod POST /v2/pods: HTTP 500; tried again at +30s" \
        in held.held[-1].reason
    assert attempts.due_plan(plan, 160.0) == plan  # 60 s after the first failure
    attempts = attempts.failed("fleetllm-h100-1", 160.0, "again")
    assert not attempts.due("fleetllm-h100-1", 279.0) and attempts.due("fleetllm-h100-1", 280.0)  # then 120 s
    assert [Attempts.wait_s(n) for n in (1, 2, 3, 7, 8, 30)] == [60, 120, 240, 3600, 3600, 3600]
    assert attempts.succeeded("fleetllm-h100-1").failures == {}


def test_the_loop_rents_with_back_off_and_counts_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reconcile loop's capacity step (fleetllm.job.capacity.CapacityLoop) against the RunPod fake: a create
    the provider refuses is counted, logged and tried again only after its back-off; then it rents."""
    import asyncio

    from prometheus_client import generate_latest

    from fleetllm.adapters.http import RetryPolicy
    from fleetllm.adapters.providers import ProviderAccess
    from fleetllm.core.notify import Event, EventKind
    from fleetllm.core.secret import Secret
    from fleetllm.job import capacity as job_capacity
    from fleetllm.job.metrics import PassMetrics
    from tests.reconcile.fakes import FakeRunPod, runpod_gpu, serve

    plan = plan_capacity(settings(count=1), [], OFFERS, placed=NONE, retired=NONE, last_servers={})

    async def planned(*_: object) -> CapacityPlan:
        return plan

    monkeypatch.setattr(job_capacity, "plan_pass_capacity", planned)
    fake = FakeRunPod(catalog=[runpod_gpu(H100, "H100 SXM", 2.69)], versions=frozenset())  # every call 404s
    metrics = PassMetrics()
    settled: list[list[str]] = []

    class Notifier:  # what the loop tells the notifier after each step: the keys failing now
        def settle(self, kind: EventKind, firing: list[Event]) -> None:
            assert kind is EventKind.CAPACITY_FAILED
            settled.append([f"{e.subject}: {e.summary}" for e in firing])

    async def go() -> list[list[bool]]:
        async with serve(fake.app()) as (port,):
            access = ProviderAccess(Secret(fake.api_key, "t"), f"http://127.0.0.1:{port}", 5, RetryPolicy(attempts=1))
            loop = job_capacity.CapacityLoop({Provider.RUNPOD: access}, metrics, Notifier())  # type: ignore[arg-type]
            outcomes = []
            for now in (0.0, 30.0, 61.0):
                outcomes.append([r.ok for r in await loop.step(None, None, now)])  # type: ignore[arg-type]
            fake.versions = frozenset({"v1", "v2"})
            outcomes.append([r.ok for r in await loop.step(None, None, 121.0)])  # type: ignore[arg-type]
            outcomes.append([r.ok for r in await loop.step(None, None, 200.0)])  # type: ignore[arg-type]
            assert loop.attempts.failures == {}
            return outcomes

    outcomes = asyncio.run(go())
    assert outcomes == [[False], [], [False], [], [True]]  # 61 s: due again; 121 s: second back-off (120 s)
    text = generate_latest(metrics.registry).decode()
    assert 'fleetllm_capacity_actions_total{kind="rent",result="failed"} 2.0' in text
    assert 'fleetllm_capacity_actions_total{kind="rent",result="ok"} 1.0' in text
    assert "fleetllm_capacity_failing 0.0" in text
    assert [p["name"] for p in fake.pods] == ["fleetllm-h100-1"] and fake.violations == []
    assert settled[0] == ["fleetllm-h100-1: fleetllm-h100-1: failed 1 time(s), tried again after a back-off: RunPod "
                          "POST /v1/pods (fleetllm-h100-1; v2 answered 404): HTTP 404: no v1 API for this account"]
    assert settled[2][0].startswith("fleetllm-h100-1: fleetllm-h100-1: failed 2 time(s)")
    assert settled[-1] == []  # the rental succeeded: resolved
    assert all(fake.api_key not in line for lines in settled for line in lines)


def test_the_listings_name_a_rental_by_its_label_with_its_endpoints() -> None:
    """What lets the reconciler dial a box placed by label: the listing maps the label to the pod or instance, its
    public ports included; a pod not labelled as a rental is listed under its id only."""
    from fleetllm.adapters.providers import by_label, runpod_boxes, vast_labelled
    from tests.reconcile.fakes import runpod_pod, vast_instance

    labelled = {**runpod_pod("k7v2m9x4q1w8e3", {8001: 41001}, ip="203.0.113.7"), "name": "fleetllm-h100-1"}
    mine = runpod_pod("handmade", {8001: 41002}, ip="203.0.113.8")
    boxes = by_label(runpod_boxes([labelled, mine]))
    assert set(boxes) == {"k7v2m9x4q1w8e3", "fleetllm-h100-1", "handmade"}
    named = boxes["fleetllm-h100-1"]
    assert (named.box, named.ident, named.endpoints[8001].host, named.endpoints[8001].port) == \
        ("fleetllm-h100-1", "pod k7v2m9x4q1w8e3", "203.0.113.7", 41001)
    clash = {**mine, "id": "fleetllm-h100-1"}  # a box of that name is listed already: it keeps the name
    assert by_label(runpod_boxes([labelled, clash]))["fleetllm-h100-1"].ident == "pod fleetllm-h100-1"
    running = vast_instance(7, "198.51.100.4", {8001: 40001}, label="fleetllm-a100-1")
    loading = vast_instance(8, "198.51.100.5", None, status="loading", label="fleetllm-a100-2")
    vast = vast_labelled([running, loading, vast_instance(9, "198.51.100.6", {8001: 1}, label="my-box")])
    assert set(vast) == {"fleetllm-a100-1", "fleetllm-a100-2"}
    assert vast["fleetllm-a100-1"].endpoints[8001].port == 40001 and vast["fleetllm-a100-1"].ident == "instance 7"
    assert dict(vast["fleetllm-a100-2"].endpoints) == {}


def test_the_back_off_and_the_rentals_waiting_outlive_a_restart(tmp_path: object,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop keeps its back-off and the rentals not heard of yet in the state store: a new loop on the same
    store (a restarted reconciler) does not try a failed rental again before its back-off, and still knows the
    rental it made; a rental whose box fetched its config, or that its provider no longer lists, waits no more."""
    import asyncio
    from pathlib import Path

    from fleetllm.adapters.http import RetryPolicy
    from fleetllm.adapters.providers import ProviderAccess
    from fleetllm.adapters.state import open_store
    from fleetllm.adapters.state.records import BoxApi, FetchRecord
    from fleetllm.core.capacity import RentalWait
    from fleetllm.core.secret import Secret
    from fleetllm.job import capacity as job_capacity
    from fleetllm.job.metrics import PassMetrics
    from tests.reconcile.fakes import FakeRunPod, runpod_gpu, serve

    plans = [plan_capacity(settings(count=1), [], OFFERS, placed=NONE, retired=NONE, last_servers={})]

    async def planned(*_: object) -> CapacityPlan:
        return plans[-1]

    monkeypatch.setattr(job_capacity, "plan_pass_capacity", planned)
    fake = FakeRunPod(catalog=[runpod_gpu(H100, "H100 SXM", 2.69)], versions=frozenset())  # every call 404s
    url = f"sqlite:///{Path(str(tmp_path)) / 'state.sqlite3'}"

    async def go() -> list[list[bool]]:
        async with serve(fake.app()) as (port,):
            access = {Provider.RUNPOD: ProviderAccess(Secret(fake.api_key, "t"), f"http://127.0.0.1:{port}", 5,
                                                      RetryPolicy(attempts=1))}
            steps = []
            store = open_store(url)
            loop = job_capacity.CapacityLoop(access, PassMetrics(), None, store)
            steps.append([r.ok for r in await loop.step(None, None, 0.0)])  # type: ignore[arg-type]
            store.close()
            store = open_store(url)  # the reconciler restarts
            loop = job_capacity.CapacityLoop(access, PassMetrics(), None, store)
            assert loop.attempts.failures["fleetllm-h100-1"][0] == 1
            steps.append([r.ok for r in await loop.step(None, None, 30.0)])  # type: ignore[arg-type]
            fake.versions = frozenset({"v1", "v2"})
            steps.append([r.ok for r in await loop.step(None, None, 61.0)])  # type: ignore[arg-type]
            store.close()
            store = open_store(url)
            pod = fake.pods[0]["id"]
            assert store.capacity_attempts().failures == {}
            assert store.rental_waits() == {"fleetllm-h100-1": RentalWait("fleetllm-h100-1", Provider.RUNPOD, pod,
                                                                          61.0)}
            listed = replace(plans[0], rentals=(), rented=(pod_box := RentedBox(
                Provider.RUNPOD, pod, pod, "fleetllm-h100-1", "h100", 2.69),), listed=frozenset({Provider.RUNPOD}))
            plans.append(listed)
            loop = job_capacity.CapacityLoop(access, PassMetrics(), None, store)
            await loop.step(None, None, 70.0)  # type: ignore[arg-type]
            assert set(store.rental_waits()) == {"fleetllm-h100-1"}  # listed, not heard of: still waiting
            store.record_fetch(FetchRecord(75.0, BoxApi.CONFIG, 200, "127.0.0.1", "fleetllm-h100-1",
                                           None, "fleetllm-h100-1", "r"))
            store.flush()
            await loop.step(None, None, 80.0)  # type: ignore[arg-type]
            assert store.rental_waits() == {}  # its box fetched its config
            loop.waits = {"fleetllm-h100-9": RentalWait("fleetllm-h100-9", Provider.RUNPOD, "gone", 1.0)}
            await loop.step(None, None, 90.0)  # type: ignore[arg-type]
            assert store.rental_waits() == {} and pod_box.label == "fleetllm-h100-1"  # not listed any more
            store.close()
            return steps

    assert asyncio.run(go()) == [[False], [], [True]]  # 30 s after a restart: still backing off (60 s)


def test_capacity_issues_say_what_fails_and_what_is_slow() -> None:
    from fleetllm.core.capacity import SLOW_RENTAL_S, RentalWait, capacity_issues, waiting

    waits = {"fleetllm-h100-1": RentalWait("fleetllm-h100-1", Provider.RUNPOD, "p1", 0.0),
             "fleetllm-h100-2": RentalWait("fleetllm-h100-2", Provider.RUNPOD, "p2", 100.0)}
    attempts = Attempts().failed("runpod:p9", 0.0, "HTTP 500").failed("runpod:p9", 60.0, "HTTP 500")
    issues = capacity_issues(attempts, waits, SLOW_RENTAL_S)
    assert [(i.kind, i.subject) for i in issues] == [("failing", "runpod:p9"), ("slow", "fleetllm-h100-1")]
    assert issues[0].text.startswith("terminate runpod:p9 failed 2 time(s)")
    assert capacity_issues(Attempts(), waits, SLOW_RENTAL_S - 1) == ()
    assert set(waiting(waits, ["fleetllm-h100-1", "fleetllm-h100-2"], ["fleetllm-h100-2"])) == {"fleetllm-h100-1"}
    assert waiting(waits, ["fleetllm-h100-2"], []) == {"fleetllm-h100-2": waits["fleetllm-h100-2"]}
    assert waiting(waits, ["fleetllm-h100-1"], ["p1"]) == {}  # heard of under its pod id (approved by hand)
