"""Fleet changes as a reviewer meets them in pull requests: each is a set of text edits to the example
fleet, committed on a branch of a real git repository."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import git

Edit = tuple[str, str, str]  # (file, old text, new text)

GEMMA_BOX = """\
  # RunPod pod, named by its pod id (RUNPOD_POD_ID), 1x H100 80GB.
  k7v2m9x4q1w8e3:
    provider: runpod
    gpu_memory_gb: 80
    disk_gb: 200
    notes: secure cloud
    servers:
      - [gemma3-27b, 8001]
"""

SCENARIOS: dict[str, list[Edit]] = {
    "move_model": [
        ("placement.yaml", "    - [qwen2.5-coder-7b, 8003]\n", ""),
        ("placement.yaml", "      - [qwen3-8b, 8002, qwen3-8b-b]\n",
         "      - [qwen3-8b, 8002, qwen3-8b-b]\n      - [qwen2.5-coder-7b, 8003]\n"),
    ],
    "swap_ports": [
        ("placement.yaml", "    - [qwen3-8b, 8001]\n    - [llama3.1-8b, 8002]\n",
         "    - [qwen3-8b, 8002]\n    - [llama3.1-8b, 8001]\n"),
    ],
    "live_field": [
        ("models.yaml", "output_cost_per_token: 6.0e-08", "output_cost_per_token: 7.0e-08"),
    ],
    "boot_field": [
        ("models.yaml", "max_model_len: 40960", "max_model_len: 65536"),
    ],
    "remove_box": [
        ("placement.yaml", GEMMA_BOX, ""),
    ],
    "add_box": [
        ("placement.yaml", GEMMA_BOX, GEMMA_BOX + """
  203.0.113.50:
    provider: vast
    gpu_memory_gb: 80
    servers:
      - [gemma3-27b, 8001]
      - [qwen3-8b, 8002]
"""),
    ],
    "rename_process": [
        ("placement.yaml", "[qwen3-8b, 8002, qwen3-8b-b]", "[qwen3-8b, 8002, qwen3-8b-second]"),
    ],
    "retire_legacy": [
        ("fleet.yaml", "listen_ports: [8001, 8002, 8003]", "listen_ports: [8000, 8001, 8002, 8003]"),
        ("fleet.yaml", """legacy_servers:
  - host: 198.51.100.23
    port: 8000
    note: pre-salt box; retire after the migration
""", ""),
    ],
    "add_gateway": [
        ("placement.yaml", "    notes: secure cloud\n", "    notes: secure cloud\n    gateway: 8002\n"),
    ],
    # A server added to gemma3-27b's 80 GB card: the card is all divided (gemma3-27b has 0.9 of it), so it is
    # divided afresh and gemma3-27b restarts too (fleetllm_contract.division).
    "add_neighbour": [
        ("placement.yaml", "      - [gemma3-27b, 8001]\n", "      - [gemma3-27b, 8001]\n      - [qwen3-8b, 8002]\n"),
    ],
    # A server leaves the 48 GB card: qwen3-8b keeps its share and runs on (the freed memory waits).
    "remove_neighbour": [
        ("placement.yaml", "      - [qwen3-8b, 8002, qwen3-8b-b]\n", ""),
    ],
    "comments_only": [
        ("placement.yaml", "# Which model runs", "# Where each model runs: which model runs"),
    ],
}


def apply(repo: Path, edits: list[Edit]) -> None:
    for name, old, new in edits:
        path = repo / name
        text = path.read_text()
        assert text.count(old) == 1, f"{name}: {old!r} must occur exactly once"
        path.write_text(text.replace(old, new))


def branch_with(repo: Path, branch: str, edits: list[Edit]) -> str:
    """Commit `edits` on a new branch off main and check it out; returns the new commit."""
    git(repo, "checkout", "-q", "-b", branch, "main")
    apply(repo, edits)
    git(repo, "commit", "-q", "-am", branch)
    return git(repo, "rev-parse", "HEAD")
