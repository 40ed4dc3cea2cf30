"""The demo's fleet: fleet-repo-example rewritten for loopback boxes, every other line as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetllm.adapters.git import read_directory
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.files import WORKTREE_REVISION, Snapshot
from fleetllm.core.fleet.model import Provider
from fleetllm.core.fleet.render import Bearers, render_box
from fleetllm.demo.fleet import DemoError, SimBox, Template, addresses, simulate, with_real_box
from tests.conftest import EXAMPLE


def snapshot(files: dict[str, str]) -> Snapshot:
    return Snapshot(WORKTREE_REVISION, {k: v.encode() for k, v in files.items()}, {k: k for k in files})


def example_files() -> dict[str, str]:
    return {p.name: p.read_text() for p in Path(EXAMPLE).glob("*.yaml")}


def test_the_example_runs_on_consecutive_loopback_addresses() -> None:
    demo = simulate(read_directory(EXAMPLE))
    example = read_directory(EXAMPLE)
    from fleetllm.core.fleet.validate import validate_snapshot

    original = validate_snapshot(example).fleet
    assert original is not None
    assert [b.name for b in demo.boxes] == ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
    assert [b.example_name for b in demo.boxes] == list(original.boxes)
    # Same shape: every box keeps its servers (model, port, name), in order.
    for sim in demo.boxes:
        assert demo.fleet.boxes[sim.name].servers == original.boxes[sim.example_name].servers
        assert demo.fleet.boxes[sim.name].provider in (None, Provider.STATIC)
    assert demo.fleet.recipes == original.recipes
    assert demo.dropped == ()


def test_providers_become_static_but_the_boot_template_follows_the_example() -> None:
    demo = simulate(read_directory(EXAMPLE))
    templates = {b.example_name: b.template for b in demo.boxes}
    assert templates["k7v2m9x4q1w8e3"] is Template.RUNPOD
    assert templates["203.0.113.24"] is Template.VAST
    text = demo.files["placement.yaml"].decode()
    assert "provider: vast" not in text and "provider: runpod" not in text
    assert "#   k7v2m9x4q1w8e3 -> 127.0.0.4" in text
    # Comments of the example are kept.
    assert "# RunPod pod, named by its pod id (RUNPOD_POD_ID), 1x H100 80GB." in text


def test_the_legacy_pair_follows_its_box() -> None:
    demo = simulate(read_directory(EXAMPLE))
    assert demo.fleet.settings.legacy_servers == frozenset({("127.0.0.5", 8000)})
    assert "note: pre-salt box; retire after the migration" in demo.files["fleet.yaml"].decode()


def test_only_the_names_change(tmp_path: Path) -> None:
    """Apart from the header and the renamed tokens, placement.yaml is the example's, line for line."""
    demo = simulate(read_directory(EXAMPLE), "127.9.0.2")
    ours = [line for line in demo.files["placement.yaml"].decode().splitlines() if not line.startswith("#")]
    theirs = [line for line in (EXAMPLE / "placement.yaml").read_text().splitlines() if not line.startswith("#")]
    renames = {sim.example_name: sim.name for sim in demo.boxes}
    expected = []
    for line in theirs:
        for old, new in renames.items():
            line = line.replace(old, new)
        expected.append(line.replace("provider: vast", "provider: static").replace("provider: runpod",
                                                                                   "provider: static"))
    assert ours == expected


def test_quoted_names_and_pinned_public_ports() -> None:
    files = example_files()
    files["placement.yaml"] = (
        "hosts:\n"
        "  '312':\n"
        "    provider: static\n"
        "    servers:\n"
        "      - [qwen3-8b, 8001]\n"
        "      - [llama3.1-8b, 8002, null, 41234]\n"
        '  "box-b":\n'
        "    - [qwen3-8b, 8001]\n")
    files["fleet.yaml"] = "version: 1\n"
    demo = simulate(snapshot(files), "127.0.3.2")
    assert list(demo.fleet.boxes) == ["127.0.3.2", "127.0.3.3"]
    assert [r.port for r in demo.fleet.boxes["127.0.3.2"].servers] == [8001]
    assert demo.dropped and "41234" in demo.dropped[0]


def test_gpu_memory_of_the_simulated_cards() -> None:
    assert SimBox("127.0.0.2", "x", Template.VAST, 2, 48).nvidia_smi_gpus == (
        "Simulated GPU 24GB (no GPU here):24576:24576;Simulated GPU 24GB (no GPU here):24576:24576")
    demo = simulate(read_directory(EXAMPLE))
    assert {b.example_name: b.gpu_memory_gb for b in demo.boxes} == {
        "203.0.113.10": 80, "203.0.113.24": 48, "k7v2m9x4q1w8e3": 80, "198.51.100.23": 80}


@pytest.mark.parametrize(("first", "count"), [("127.0.0.1", 2), ("127.255.255.254", 3), ("10.0.0.2", 1),
                                              ("not-an-address", 1), ("::1", 1)])
def test_addresses_stay_in_loopback_and_off_the_control_plane(first: str, count: int) -> None:
    with pytest.raises(DemoError):
        addresses(first, count)


def test_addresses() -> None:
    assert addresses("127.0.0.254", 3) == ["127.0.0.254", "127.0.0.255", "127.0.1.0"]


def test_two_gateway_boxes_whose_servers_share_a_loopback_port_are_refused() -> None:
    files = example_files()
    files["placement.yaml"] = (
        "hosts:\n"
        "  box-a:\n    gateway: 8003\n    servers:\n      - [qwen3-8b, 9001]\n"
        "  box-b:\n    gateway: 8003\n    servers:\n      - [llama3.1-8b, 9001]\n")
    files["fleet.yaml"] = "version: 1\n"
    with pytest.raises(DemoError, match=r"127\.0\.0\.1:9001"):
        simulate(snapshot(files))


def test_an_invalid_example_is_reported() -> None:
    files = example_files()
    files["placement.yaml"] = "hosts:\n  box-a:\n    - [no-such-model, 8001]\n"
    with pytest.raises(DemoError, match="not valid"):
        simulate(snapshot(files))


def test_the_real_vllm_box_comes_after_the_simulated_ones() -> None:
    """--real-vllm: one more box, on the next address, of two real vLLM servers on one card, the CPU flags
    in the recipes' settings; its servers' box JSON carries them as vLLM flags."""
    demo = simulate(read_directory(EXAMPLE))
    real = with_real_box(demo, "/opt/harness/models/tiny-llama", "127.0.0.2", max_model_len=512,
                         kv_cache_bytes=67108864, max_num_seqs=8)
    assert real.boxes[:-1] == demo.boxes
    box = real.boxes[-1]
    assert (box.name, box.real_vllm, box.gpus) == (f"127.0.0.{2 + len(demo.boxes)}", True, 1)
    rows = real.fleet.boxes[box.name].servers
    assert [(r.model, r.port) for r in rows] == [("tiny-real-a", 8001), ("tiny-real-b", 8002)]
    recipe = real.fleet.recipes["tiny-real-a"].vllm
    assert (recipe.model, recipe.max_model_len) == ("/opt/harness/models/tiny-llama", 512)
    document = render_box(real.fleet, box.name, Bearers(Salt("demo-salt-0123456789abcdef")))
    assert document["servers"][0]["args"] == ["--kv-cache-memory-bytes", "67108864", "--max-num-seqs", "8"]
    assert set(real.fleet.boxes) - set(demo.fleet.boxes) == {box.name}


def test_the_demo_fleet_polls_and_drains_fast() -> None:
    """A rollout scenario takes tens of seconds: the box agents poll every 5 s and drains last 3 s."""
    from fleetllm.core.fleet.files import FLEET_FILE
    from fleetllm.demo.fleet import DEMO_DRAIN_S, DEMO_POLL_S, _fast_rollout

    demo = simulate(read_directory(EXAMPLE))
    rollout = demo.fleet.settings.rollout
    assert (rollout.poll_s, rollout.drain_s) == (DEMO_POLL_S, DEMO_DRAIN_S) == (5, 3)
    before = (EXAMPLE / FLEET_FILE).read_text().splitlines()
    after = demo.files[FLEET_FILE].decode().splitlines()
    assert [(a, b) for a, b in zip(before, after, strict=True) if a != b and "- host:" not in a] == [
        ("  poll_s: 30                  # the box agent polls its config this often",
         "  poll_s: 5                  # the box agent polls its config this often"),
        ("  drain_s: 10                 # seconds between deleting a deployment and restarting its box",
         "  drain_s: 3                 # seconds between deleting a deployment and restarting its box")]
    # A fleet.yaml without a rollout mapping gets one.
    assert _fast_rollout("version: 1\n").endswith("rollout:\n  poll_s: 5\n  drain_s: 3\n")
