"""`fleetllm reconcile --metrics-listen`'s HTTP server (fleetllm.job.metrics.serve_metrics): the pass metrics
behind metrics_token as the control plane's /metrics (401 without it, 403 with another, no metric either
way), /health/live for a pod's probes without any token, and public metrics when no token is configured."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from fleetllm.core.secret import Secret
from fleetllm.job.metrics import PassMetrics, serve_metrics

TOKEN = "reconcile-metrics-token-0123456789"


def get(url: str, token: str | None = None) -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def test_the_reconcilers_metrics_need_the_token_and_its_health_does_not() -> None:
    metrics = PassMetrics()
    metrics.skipped.inc()
    server = serve_metrics("127.0.0.1:0", metrics.registry, Secret(TOKEN, "${env:METRICS}"))
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        status, headers, body = get(base + "/metrics")
        assert status == 401 and headers["WWW-Authenticate"] == 'Bearer realm="fleetllm metrics"'
        assert "metrics_token" in json.loads(body)["error"] and "fleetllm_" not in body
        status, _, body = get(base + "/metrics", "another-token-0123456789abcdef")
        assert status == 403 and "fleetllm_" not in body and "another-token" not in body
        status, _, body = get(base + "/", None)  # every path but /health/live is the exposition: guarded alike
        assert status == 401
        status, _, body = get(base + "/metrics", TOKEN)
        assert status == 200 and "fleetllm_reconcile_skipped_total 1.0" in body
        status, _, body = get(base + "/health/live")  # the pod's probes send no token
        assert (status, body) == (200, "ok\n")
    finally:
        server.shutdown()
        server.server_close()


def test_without_a_token_the_reconcilers_metrics_are_public() -> None:
    metrics = PassMetrics()
    server = serve_metrics("127.0.0.1:0", metrics.registry, None)
    try:
        status, _, body = get(f"http://127.0.0.1:{server.server_port}/metrics")
        assert status == 200 and "fleetllm_reconcile_skipped_total 0.0" in body
    finally:
        server.shutdown()
        server.server_close()
