"""Generate a synthetic fleet repository of N boxes with three servers each (for benchmarks)."""

from __future__ import annotations

from pathlib import Path

MODELS = 12


def models_yaml() -> str:
    lines = ["models:"]
    for i in range(MODELS):
        lines += [f"  model-{i}:",
                  "    vllm:",
                  f"      model: org/model-{i}",
                  "      max_model_len: 32768",
                  "      vram_gb: 9",
                  "      disk_gb: 12",
                  "      settings: {enable-prefix-caching: true, max-num-batched-tokens: 4096}",
                  "    litellm:",
                  "      model_info: {context_window: 32768, input_cost_per_token: 2.0e-08}"]
    return "\n".join(lines) + "\n"


def box_name(i: int) -> str:
    return f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"


def placement_yaml(boxes: int) -> str:
    lines = ["hosts:"]
    for i in range(boxes):
        lines.append(f"  {box_name(i)}:")
        for slot in range(3):
            lines.append(f"    - [model-{(i + slot) % MODELS}, {8001 + slot}, s{slot}]")
        lines.append("")
    return "\n".join(lines)


def write_fleet(root: Path, boxes: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "fleet.yaml").write_text("listen_ports: [8001, 8002, 8003]\n")
    (root / "models.yaml").write_text(models_yaml())
    (root / "placement.yaml").write_text(placement_yaml(boxes))
    return root
