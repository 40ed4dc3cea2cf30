"""The reconciler's per-model series (intended vs serving servers), LiteLLM reachability and the rollout
series, as the alert rules of deploy/prometheus read them."""

from __future__ import annotations

import dataclasses

from prometheus_client import generate_latest

from fleetllm.adapters.state.passes import PassRecord, ServerRecord
from fleetllm.job.metrics import PassMetrics


def server(box: str, model: str, verdict: str) -> ServerRecord:
    return ServerRecord(box, 8001, model, model, verdict, "")


RECORD = PassRecord(100.0, 1.5, "a" * 40, "apply", {"Healthy": 2, "Stale": 1, "Down": 1, "Unknown": 1},
                    servers=(server("b1", "qwen", "Healthy"), server("b2", "qwen", "Down"),
                             server("b3", "qwen", "Stale"), server("b1", "llama", "Unknown"),
                             server("b2", "llama", "Healthy")))


def text(metrics: PassMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_intended_and_serving_servers_per_model() -> None:
    metrics = PassMetrics()
    metrics.observe(RECORD)
    out = text(metrics)
    assert 'fleetllm_model_intended_servers{model="qwen"} 3.0' in out
    assert 'fleetllm_model_serving_servers{model="qwen"} 2.0' in out  # Healthy and Stale serve, Down does not
    assert 'fleetllm_model_intended_servers{model="llama"} 2.0' in out
    assert 'fleetllm_model_serving_servers{model="llama"} 1.0' in out  # Unknown is not counted as serving


def test_stale_servers_per_box() -> None:
    metrics = PassMetrics()
    metrics.observe(RECORD)
    out = text(metrics)
    assert 'fleetllm_box_stale_servers{box="b3"} 1.0' in out
    assert 'fleetllm_box_stale_servers{box="b1"}' not in out  # no Stale server: no series (the alert resolves)
    metrics.observe(dataclasses.replace(RECORD, servers=RECORD.servers[:2]))
    assert "fleetllm_box_stale_servers{" not in text(metrics)


def test_a_model_gone_from_the_revision_loses_its_series() -> None:
    metrics = PassMetrics()
    metrics.observe(RECORD)
    metrics.observe(dataclasses.replace(RECORD, servers=RECORD.servers[:3]))
    out = text(metrics)
    assert 'model="llama"' not in out
    assert 'fleetllm_model_intended_servers{model="qwen"} 3.0' in out


def test_a_model_with_no_server_serving_reads_zero() -> None:
    metrics = PassMetrics()
    metrics.observe(dataclasses.replace(RECORD, servers=(server("b1", "qwen", "Stalled"),)))
    assert 'fleetllm_model_serving_servers{model="qwen"} 0.0' in text(metrics)


def test_litellm_reachability_and_rollout_series() -> None:
    metrics = PassMetrics()
    assert "fleetllm_litellm_up NaN" in text(metrics)  # unknown before a pass: neither up nor an alert
    metrics.observe_litellm(listed=True)
    assert "fleetllm_litellm_up 1.0" in text(metrics)
    metrics.observe_litellm(listed=False)
    assert "fleetllm_litellm_up 0.0" in text(metrics)
    metrics.rollout_halted.set(1)
    metrics.rollout_halts.inc()
    out = text(metrics)
    assert "fleetllm_rollout_halted 1.0" in out
    assert "fleetllm_rollout_halts_total 1.0" in out
