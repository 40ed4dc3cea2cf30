"""GET /metrics behind `metrics_token` (issue 27: unauthenticated /metrics listed every box name and pod id
and whether the salt is weak). With the token set, /metrics answers only that bearer: 401 without one, 403
with another (a viewer token too), a JSON error and no metric either way; /health stays public. Without
it /metrics stays public, as before the setting, and `serve --check` warns."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fleetllm.server.app import create_app
from fleetllm.server.runtime import Runtime
from fleetllm.settings import Listen, metrics_token_warning
from tests.server.conftest import ENV, KNOWN_BOX, METRICS_TOKEN, VIEWER_TOKEN, base_config, write_config
from tests.server.test_config import problems


def test_with_a_metrics_token_only_its_bearer_reads_metrics(make_runtime: Callable[..., Runtime]) -> None:
    runtime = make_runtime(metrics_token="${env:METRICS}")
    assert metrics_token_warning(runtime.config, Listen("192.0.2.10", 8080)) is None
    client = create_app(runtime).test_client()
    refused = client.get("/metrics")
    assert refused.status_code == 401
    assert refused.headers["WWW-Authenticate"] == 'Bearer realm="fleetllm metrics"'
    assert refused.get_json() == {"error": "GET /metrics needs the metrics token (metrics_token in the config): send "
                                           "Authorization: Bearer <token>, e.g. Prometheus' "
                                           "authorization.credentials_file"}
    for token in (VIEWER_TOKEN, "not-the-metrics-token-0123456789", METRICS_TOKEN + "x"):
        wrong = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
        assert wrong.status_code == 403
        assert wrong.get_json() == {"error": "wrong metrics token: send the one metrics_token in the config refers to"}
    for answer in (refused, wrong, client.get("/metrics", headers={"Authorization": f"Basic {METRICS_TOKEN}"})):
        text = answer.get_data(as_text=True)
        assert answer.status_code in (401, 403)
        assert "fleetllm_" not in text and KNOWN_BOX not in text and "vllm_api_salt" not in text  # no label leaks
        assert METRICS_TOKEN not in text
    served = client.get("/metrics", headers={"Authorization": f"bearer {METRICS_TOKEN}"})
    assert served.status_code == 200
    text = served.get_data(as_text=True)
    assert f'box="{KNOWN_BOX}"' in text and 'fleetllm_weak_secret{secret="vllm_api_salt"}' in text
    assert client.get("/health").status_code == 200  # public still
    live = client.get("/health/live")  # the pods' liveness probe: public, sends no token
    assert live.status_code == 200 and live.get_json()["status"] == "alive"


def test_without_a_metrics_token_metrics_stay_public_with_a_warning(make_runtime: Callable[..., Runtime]) -> None:
    runtime = make_runtime()
    client = create_app(runtime).test_client()
    assert client.get("/metrics").status_code == 200
    warning = metrics_token_warning(runtime.config, Listen("192.0.2.10", 8080))
    assert warning is not None and "GET /metrics is public" in warning and "set metrics_token" in warning
    assert metrics_token_warning(runtime.config, Listen("127.0.0.1", 8080)) is None  # nobody else reaches it


def test_metrics_token_is_a_reference_of_24_characters_or_more(tmp_path: Path) -> None:
    head = "repo: {path: /x}\nsecrets: {vllm_api_salt: '${env:SALT}'}\nstate: {url: 'sqlite:///s.db'}\n"
    short = problems(tmp_path, head + "metrics_token: '${env:SHORT}'\n", env={**ENV, "SHORT": "short-metrics"})
    assert "/metrics_token: metrics_token (${env:SHORT}) is 13 characters; it needs at least 24" in short
    assert "short-metrics" not in short
    literal = problems(tmp_path, head + "metrics_token: a-literal-metrics-token-0123456789\n")
    assert "/metrics_token: not a secret reference" in literal
    assert "a-literal-metrics-token" not in literal


def test_serve_check_warns_of_public_metrics(tmp_path: Path, fleet_git: Path) -> None:
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    document = base_config(fleet_git, tmp_path / "cp.sqlite3")
    env = {**os.environ, **ENV}

    def check(extra: dict[str, str], *flags: str) -> str:
        config = write_config(tmp_path / "cp.yaml", {**document, **extra})
        done = subprocess.run([sys.executable, "-m", "fleetllm", "serve", "--check", "--config", str(config), *flags],
                              capture_output=True, text=True, cwd=ROOT, env=env, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        return done.stderr

    beyond = ("--listen", "0.0.0.0:8080", "--insecure-http")  # reachable from other machines
    assert "warning: no metrics_token: GET /metrics is public" in check({}, *beyond)
    assert "metrics_token" not in check({"metrics_token": "${env:METRICS}"}, *beyond)
    assert "metrics_token" not in check({})  # the default listen, 127.0.0.1: nobody else reaches it
