"""A bearer salt shorter than 16 characters (one an llmao fleet already runs on) is served, never refused:
the attention strip, /api/attention and the fleetllm_weak_secret metric say so, without the salt."""

from __future__ import annotations

from pathlib import Path

from tests.pages.conftest import LogCapture, build_world, login
from tests.server.conftest import METRICS_TOKEN, VIEWER_TOKEN

SHORT_SALT = "salt12chars!"
METRICS = {"Authorization": f"Bearer {METRICS_TOKEN}"}  # metrics_token of the pages' world


def test_a_short_salt_is_served_with_a_warning(tmp_path: Path, logs: LogCapture) -> None:
    world = build_world(tmp_path, passes=0, broken=False, env={"SALT": SHORT_SALT})
    try:
        client = world.app.test_client()
        assert login(client, VIEWER_TOKEN).status_code == 302
        attention = client.get("/api/attention").get_json()
        assert len(attention["secrets"]) == 1 and "secrets.vllm_api_salt" in attention["secrets"][0]
        assert "Rotate the salt" in attention["secrets"][0]
        page = client.get("/").get_data(as_text=True)
        assert "Weak secret" in page and 'data-kind="secret"' in page
        metrics = client.get("/metrics", headers=METRICS).get_data(as_text=True)
        assert 'fleetllm_weak_secret{secret="vllm_api_salt"} 1.0' in metrics
        for shown in (str(attention), page, metrics, logs.text):
            assert SHORT_SALT not in shown
    finally:
        world.runtime.stop()


def test_a_long_salt_raises_no_warning(tmp_path: Path, logs: LogCapture) -> None:
    world = build_world(tmp_path, passes=0, broken=False)
    try:
        client = world.app.test_client()
        assert login(client, VIEWER_TOKEN).status_code == 302
        assert client.get("/api/attention").get_json()["secrets"] == []
        assert 'fleetllm_weak_secret{secret="vllm_api_salt"} 0.0' in client.get("/metrics", headers=METRICS).get_data(as_text=True)
    finally:
        world.runtime.stop()
