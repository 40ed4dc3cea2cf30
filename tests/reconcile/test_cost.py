"""What the fleet costs (fleetllm.core.cost): prices from the listings, per box, per model and for the fleet,
the change a pull request makes, the pass record and the metrics that carry it, and `show`/`diff --prices`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from fleetllm.adapters.providers import runpod_boxes, runpod_v1_boxes, vast_boxes
from fleetllm.adapters.state.passes import CostRecord, PassRecord
from fleetllm.cli.main import main
from fleetllm.core.cost import BoxPrice, PriceSource, cost_change, fleet_cost, money, read_prices
from fleetllm.core.fleet.model import Fleet, Provider
from fleetllm.core.judge.observed import ProviderListing, listing_prices
from fleetllm.job.metrics import PassMetrics
from tests.diff.scenarios import SCENARIOS, branch_with
from tests.fleet.helpers import validate
from tests.reconcile.fakes import runpod_pod, runpod_pod_v1, vast_instance

PLACEMENT = """\
hosts:
  203.0.113.10:
    provider: vast
    servers:
      - [m1, 8001]
      - [m2, 8002]
  pod-h100:
    provider: runpod
    servers:
      - [m1, 8001]
  pod-dark:
    provider: runpod
    servers:
      - [m2, 8001]
  198.51.100.5:
    - [m1, 8001]
"""


def fleet(placement: str = PLACEMENT) -> Fleet:
    found = validate(placement=placement).fleet
    assert found is not None
    return found


VAST_A100 = BoxPrice("203.0.113.10", Provider.VAST, 1.60, "A100 SXM4 80GB", 1)
RUNPOD_H100 = BoxPrice("pod-h100", Provider.RUNPOD, 2.49, "H100 80GB HBM3", 1)


def test_listings_carry_the_price_each_provider_bills() -> None:
    item = vast_instance(7, "203.0.113.10", {8001: 40001})
    item.update(dph_total=1.6034, gpu_name="A100 SXM4 80GB", num_gpus=2)
    vast = vast_boxes([item])["203.0.113.10"]
    assert (vast.price, vast.gpu, vast.gpus) == (1.6034, "A100 SXM4 80GB", 2)
    pod = runpod_pod("pod-h100", {8001: 41000})
    v2 = runpod_boxes([pod])["pod-h100"]
    assert (v2.price, v2.gpu, v2.gpus) == (2.69, "H100 80GB HBM3", 1)
    v1 = runpod_v1_boxes([runpod_pod_v1(pod)])["pod-h100"]
    assert (v1.price, v1.gpu, v1.gpus) == (2.69, "H100 SXM", 1)
    assert runpod_v1_boxes([{**runpod_pod_v1(pod), "costPerHr": "0.74"}])["pod-h100"].price == 0.74  # v1's example
    for bad in (None, "n/a", -1, True, float("nan")):
        assert vast_boxes([{**item, "dph_total": bad}])["203.0.113.10"].price is None, bad


def test_a_failed_or_ambiguous_listing_prices_nothing() -> None:
    twins = [vast_instance(1, "192.0.2.9", None), vast_instance(2, "192.0.2.9", None)]
    for twin in twins:
        twin["dph_total"] = 0.5
    listings = {Provider.VAST: ProviderListing(Provider.VAST, vast_boxes(twins)),
                Provider.RUNPOD: ProviderListing(Provider.RUNPOD, runpod_boxes([runpod_pod("p", None)]),
                                                 error="RunPod GET /v2/pods: 503")}
    assert listing_prices(listings) == {}
    listings[Provider.RUNPOD] = ProviderListing(Provider.RUNPOD, runpod_boxes([runpod_pod("p", {8001: 1})]))
    assert listing_prices(listings) == {"p": BoxPrice("p", Provider.RUNPOD, 2.69, "H100 80GB HBM3", 1)}


def test_box_model_and_fleet_cost() -> None:
    cost = fleet_cost(fleet(), {p.box: p for p in (VAST_A100, RUNPOD_H100)})
    assert cost.total == pytest.approx(4.09)
    assert cost.box("pod-h100") == 2.49 and cost.box("pod-dark") is None
    assert cost.unpriced == ("pod-dark",)  # rented, not priced: named; the static box is not rented
    # the Vast box is shared by vram_gb (m1 10, m2 30): m1 a quarter, m2 three quarters; m1 has the H100 too
    assert cost.models == pytest.approx({"m1": 0.40 + 2.49, "m2": 1.20})


def test_a_box_whose_servers_lack_vram_gb_is_shared_evenly() -> None:
    models = "models:\n  m1:\n    vllm: {model: org/m1}\n  m2:\n    vllm: {model: org/m2, vram_gb: 30}\n"
    found = validate(models=models, placement=PLACEMENT).fleet
    assert found is not None
    assert fleet_cost(found, {"203.0.113.10": VAST_A100}).models == pytest.approx({"m1": 0.80, "m2": 0.80})


def test_the_change_a_pull_request_makes() -> None:
    base = fleet()
    head = fleet(PLACEMENT.replace("  pod-h100:\n    provider: runpod\n    servers:\n      - [m1, 8001]\n", "")
                 + "  pod-new:\n    provider: runpod\n    servers:\n      - [m1, 8001]\n")
    prices = {p.box: p for p in (VAST_A100, RUNPOD_H100,
                                 BoxPrice("pod-new", Provider.RUNPOD, 2.49, "H100 80GB", 1, PriceSource.OFFER))}
    change = cost_change(base, head, prices)
    assert [line.text() for line in change.lines] == ["+$2.49/h: 1 × H100 80GB on RunPod (pod-new)",
                                                      "-$2.49/h: 1 × H100 80GB HBM3 on RunPod (pod-h100)"]
    assert change.delta == pytest.approx(0) and change.changed
    assert change.text_lines()[-1] == "fleet: $4.09/h -> $4.09/h (+$0.00/h)"
    assert not cost_change(base, base, prices).changed


def test_a_box_added_without_a_price_is_named_not_counted_as_free() -> None:
    head = fleet(PLACEMENT + "  pod-unseen:\n    provider: runpod\n    servers:\n      - [m1, 8001]\n")
    change = cost_change(fleet(), head, {"203.0.113.10": VAST_A100})
    assert change.lines == () and change.unpriced == ("pod-unseen",)
    assert "? pod-unseen: price not known" in change.text_lines()[0]


def test_money() -> None:
    assert (money(2.489), money(-1), money(2.49, sign=True), money(-0.5, sign=True)) == \
        ("$2.49/h", "-$1.00/h", "+$2.49/h", "-$0.50/h")
    assert money(1234.5) == "$1,234.50/h"


@pytest.mark.parametrize(("document", "message"), [
    ({}, "no `prices` object"),
    ({"prices": {"b": 1}}, "prices.b: an object"),
    ({"prices": {"b": {"provider": "runpod"}}}, "prices.b: per_hour is missing"),
    ({"prices": {"b": {"provider": "runpod", "per_hour": -2}}}, "non-negative"),
    ({"prices": {"b": {"provider": "azure", "per_hour": 2}}}, "prices.b: 'azure'"),
])
def test_a_prices_document_that_is_not_one_says_what_is_wrong(document: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        read_prices(document)  # type: ignore[arg-type]
    assert message in str(caught.value)


def test_prices_round_trip_through_their_json() -> None:
    doc = {"prices": {p.box: p.as_json() for p in (VAST_A100, RUNPOD_H100)}}
    assert read_prices(json.loads(json.dumps(doc))) == {"203.0.113.10": VAST_A100, "pod-h100": RUNPOD_H100}


def test_the_pass_record_keeps_the_cost_and_the_metrics_show_it() -> None:
    cost = CostRecord(4.09, {"203.0.113.10": 1.6, "pod-h100": 2.49}, {"m1": 2.89, "m2": 1.2}, ("pod-dark",),
                      {"pod-h100": "1 × H100 80GB HBM3 on RunPod"})
    record = PassRecord(1.0, 0.1, "a" * 40, "apply", {}, cost=cost)
    assert PassRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
    assert PassRecord.from_json({k: v for k, v in record.to_json().items() if k != "cost"}).cost is None
    metrics = PassMetrics()
    metrics.observe(record)
    text = generate_latest(metrics.registry).decode()
    assert "fleetllm_fleet_cost_per_hour 4.09" in text
    assert 'fleetllm_box_cost_per_hour{box="pod-h100"} 2.49' in text
    assert 'fleetllm_model_cost_per_hour{model="m2"} 1.2' in text
    assert "fleetllm_unpriced_boxes 1.0" in text
    metrics.observe(PassRecord(2.0, 0.1, "a" * 40, "apply", {}))  # nothing priced: the series go
    text = generate_latest(metrics.registry).decode()
    assert "fleetllm_box_cost_per_hour{" not in text and "fleetllm_fleet_cost_per_hour 0.0" in text


def prices_file(tmp_path: Path, *prices: BoxPrice) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"format_version": "1.2", "actions": [],
                                "prices": {p.box: p.as_json() for p in prices}}))
    return str(path)


def test_diff_shows_the_cost_a_pull_request_adds(fleet_git: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    branch_with(fleet_git, "pr", SCENARIOS["add_box"])
    prices = prices_file(tmp_path, BoxPrice("203.0.113.50", Provider.VAST, 2.49, "H100 80GB", 1),
                         BoxPrice("203.0.113.24", Provider.VAST, 0.39, "RTX A6000", 1))
    assert main(["diff", "--repo", str(fleet_git), "--format", "markdown", "--prices", prices]) == 0
    out = capsys.readouterr().out
    assert "**Cost** (USD per hour" in out
    assert "- +$2.49/h: 1 × H100 80GB on Vast (203.0.113.50)" in out
    assert "- fleet: $0.39/h -> $2.88/h (+$2.49/h)" in out
    assert out.index("**Cost**") < out.index("<details>")  # on top, not folded away
    assert main(["diff", "--repo", str(fleet_git), "--format", "json", "--attach-plan", prices]) == 0
    cost = json.loads(capsys.readouterr().out)["cost"]
    assert cost["delta_per_hour"] == 2.49 and cost["lines"][0]["boxes"] == ["203.0.113.50"]
    assert main(["diff", "--repo", str(fleet_git)]) == 0
    assert "Cost" not in capsys.readouterr().out  # no prices given: no cost claimed


def test_diff_refuses_a_prices_file_that_is_not_one(fleet_git: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"prices": {"x": {"provider": "vast"}}}')
    assert main(["diff", "main", "main", "--repo", str(fleet_git), "--prices", str(bad)]) == 2
    assert f"--prices {bad}: prices.x: per_hour is missing" in capsys.readouterr().err


def test_show_prices_each_box_model_and_the_fleet(fleet_git: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    prices = prices_file(tmp_path, BoxPrice("203.0.113.24", Provider.VAST, 0.39, "RTX A6000", 1))
    assert main(["show", str(fleet_git), "--prices", prices]) == 0
    out = capsys.readouterr().out
    assert "$/h" in out and "$0.39/h" in out and "fleet: $0.39/h for 1 priced box(es)" in out
    assert main(["show", str(fleet_git), "--prices", prices, "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["cost"]["total_per_hour"] == 0.39 and shown["cost"]["boxes"] == {"203.0.113.24": 0.39}
    assert sum(shown["cost"]["models"].values()) == pytest.approx(0.39)


POOLS = """capacity:
  max_fleet_per_hour: 20
  pools:
    h100:
      provider: runpod
      gpu: NVIDIA H100 80GB HBM3
      gpus: 1
      count: COUNT
      max_per_hour: 3
      template: tmpl
"""


def test_a_pool_change_is_priced_at_its_offer_or_at_most_its_ceiling() -> None:
    def with_pool(count: int) -> Fleet:
        found = validate(fleet="listen_ports: [8001, 8002, 8003]\n" + POOLS.replace("COUNT", str(count)),
                         placement=PLACEMENT).fleet
        assert found is not None
        return found

    base, head = fleet(), with_pool(2)
    ceiling = cost_change(base, head, {})
    assert [line.text() for line in ceiling.lines] == \
        ["at most +$6.00/h: 2 × NVIDIA H100 80GB HBM3 on RunPod (pool h100, 2 boxes)"]
    offered = BoxPrice("fleetllm-h100-1", Provider.RUNPOD, 2.49, "H100 80GB", 1, PriceSource.OFFER)
    change = cost_change(base, head, {"fleetllm-h100-1": offered, "203.0.113.10": VAST_A100})
    assert change.lines[0].text() == "+$4.98/h: 2 × NVIDIA H100 80GB HBM3 on RunPod (pool h100, 2 boxes)"
    assert change.text_lines()[-1] == "fleet: $1.60/h -> $6.58/h (+$4.98/h)"
    down = cost_change(with_pool(2), with_pool(1), {"fleetllm-h100-1": offered})
    assert [line.text() for line in down.lines] == ["-$2.49/h: 1 × NVIDIA H100 80GB HBM3 on RunPod (pool h100, 1 box)"]
    assert not cost_change(with_pool(1), with_pool(1), {}).changed
