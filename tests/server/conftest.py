"""Fixtures for the control plane: a config file over a real fleet git repo, the runtime, the app."""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from flask import Flask
from flask.testing import FlaskClient

from fleetllm.core.fleet.bearer import Salt
from fleetllm.logs import setup_logging
from fleetllm.server.app import create_app
from fleetllm.server.runtime import Runtime, start_up
from fleetllm.settings import ControlPlaneConfig, load_config
from tests.conftest import TEST_LEGACY_KEY, TEST_SALT

FLEET_KEY = "fleet-key-for-tests-0123456789"
ADMIN_TOKEN = "admin-token-for-tests-0123"
OPERATOR_TOKEN = "operator-token-for-tests-0123"
OPERATOR_NAME = "deployer"  # operator_tokens names it: the audit trail says token:deployer
VIEWER_TOKEN = "viewer-token-for-tests-0123"
WEBHOOK_SECRET = "webhook-secret-for-tests"
METRICS_TOKEN = "metrics-token-for-tests-0123"  # metrics_token: ${env:METRICS}, where a test sets it
ENV = {"FLEET_KEY": FLEET_KEY, "SALT": TEST_SALT, "LEGACY": TEST_LEGACY_KEY, "ADMIN": ADMIN_TOKEN,
       "OPERATOR": OPERATOR_TOKEN, "VIEWER": VIEWER_TOKEN, "HOOK": WEBHOOK_SECRET, "METRICS": METRICS_TOKEN}
SECRETS = (FLEET_KEY, TEST_SALT, TEST_LEGACY_KEY, ADMIN_TOKEN, OPERATOR_TOKEN, VIEWER_TOKEN, WEBHOOK_SECRET,
           METRICS_TOKEN)
KNOWN_BOX = "203.0.113.24"


def base_config(repo: Path, state: Path) -> dict[str, Any]:
    return {
        "repo": {"path": str(repo), "branch": "main", "refresh_interval_s": 3600,
                 "webhook_secret": "${env:HOOK}"},
        "secrets": {"fleet_key": "${env:FLEET_KEY}", "vllm_api_salt": "${env:SALT}",
                    "legacy_api_key": "${env:LEGACY}"},
        "state": {"url": f"sqlite:///{state}"},
        "admin_tokens": ["${env:ADMIN}"],
        "operator_tokens": [{"name": OPERATOR_NAME, "token": "${env:OPERATOR}"}],
        "viewer_tokens": ["${env:VIEWER}"],
        "attention": {"max_entries": 5},
    }


def write_config(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


class LogCapture:
    """The JSON lines the `fleetllm` loggers wrote."""

    def __init__(self) -> None:
        self.stream = io.StringIO()

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def events(self, name: str) -> list[dict[str, Any]]:
        import json

        return [e for e in map(json.loads, self.text.splitlines()) if e["event"] == name]


@contextmanager
def capturing_logs(level: int = logging.INFO) -> Iterator[LogCapture]:
    """The `fleetllm` loggers write to a LogCapture at `level` while it is open."""
    capture = LogCapture()
    setup_logging(capture.stream, level)
    try:
        yield capture
    finally:
        setup_logging()


@pytest.fixture
def logs() -> Iterator[LogCapture]:
    with capturing_logs() as capture:
        yield capture


@pytest.fixture
def make_config(tmp_path: Path, fleet_git: Path) -> Callable[..., ControlPlaneConfig]:
    def make(**overrides: Any) -> ControlPlaneConfig:
        document = base_config(fleet_git, tmp_path / "state" / "cp.sqlite3")
        for key, value in overrides.items():
            if value is None:
                document.pop(key, None)
            elif isinstance(value, dict) and isinstance(document.get(key), dict):
                merged = {**document[key], **value}
                document[key] = {k: v for k, v in merged.items() if v is not None}
            else:
                document[key] = value
        return load_config(write_config(tmp_path / "control-plane.yaml", document), env=ENV)

    return make


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def make_runtime(make_config: Callable[..., ControlPlaneConfig]) -> Iterator[Callable[..., Runtime]]:
    made: list[Runtime] = []

    def make(**overrides: Any) -> Runtime:
        runtime = start_up(make_config(**overrides), clock=Clock())
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        runtime.stop()


@pytest.fixture
def runtime(make_runtime: Callable[..., Runtime], logs: LogCapture) -> Runtime:
    return make_runtime()


@pytest.fixture
def app(runtime: Runtime) -> Flask:
    return create_app(runtime)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def box_headers(host: str | None = KNOWN_BOX, key: str | None = FLEET_KEY, **extra: str) -> dict[str, str]:
    headers = dict(extra)
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if host is not None:
        headers["X-LLMAO-Host"] = host
        if host:
            headers["X-Fleetllm-Report-Key"] = Salt(TEST_SALT).report_key(host)  # POST /vllm/report: its own
    return headers
