"""The notifications section of the control plane's config: secrets as references only, never quoted
back; what each kind accepts; plain http only where no secret would cross a network."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetllm.core.notify import EventKind, TargetKind
from fleetllm.errors import ConfigurationError
from fleetllm.settings import ControlPlaneConfig, load_config

SLACK_URL = "https://hooks.slack.com/services/T0/B0/slackSecretPath9"
ENV = {"SALT": "salt-0123456789abcdef", "SLACK": SLACK_URL, "TOKEN": "bearer-token-0123456789"}


def config(tmp_path: Path, *targets: dict[str, Any], **section: Any) -> ControlPlaneConfig:
    document = {"repo": {"path": str(tmp_path)}, "secrets": {"vllm_api_salt": "${env:SALT}"},
                "state": {"url": "sqlite:///state.db"}, "notifications": {"targets": list(targets), **section}}
    path = tmp_path / "cp.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_config(path, ENV)


def refused(tmp_path: Path, *targets: dict[str, Any]) -> str:
    with pytest.raises(ConfigurationError) as caught:
        config(tmp_path, *targets)
    return str(caught.value)


def test_targets_are_built_with_their_secrets_wrapped(tmp_path: Path) -> None:
    built = config(tmp_path,
                   {"name": "ops", "kind": "webhook", "url": "https://alerts.example.com/x", "bearer": "${env:TOKEN}",
                    "header": {"name": "X-Token", "value": "${env:TOKEN}"}, "events": ["pass_failed"]},
                   {"name": "chat", "kind": "slack", "url": "${env:SLACK}", "events": ["invalid_commit"]},
                   renotify_interval_s=600)
    ops, chat = built.notifications.targets
    assert (ops.kind, ops.events, ops.header and ops.header[0]) == (TargetKind.WEBHOOK,
                                                                    frozenset({EventKind.PASS_FAILED}), "X-Token")
    assert chat.url.reveal() == SLACK_URL and chat.url.reference == "${env:SLACK}"
    assert built.notifications.renotify_interval_s == 600.0
    assert SLACK_URL not in repr(built) and "bearer-token" not in repr(built)
    assert config(tmp_path).notifications.targets == ()


def test_a_slack_url_written_in_the_file_is_refused_without_being_quoted(tmp_path: Path) -> None:
    message = refused(tmp_path, {"name": "chat", "kind": "slack", "url": SLACK_URL, "events": ["pass_failed"]})
    assert "/notifications/targets/0/url" in message and "secret reference" in message
    assert "slackSecretPath9" not in message


def test_a_slack_target_takes_no_bearer_and_names_must_differ(tmp_path: Path) -> None:
    message = refused(tmp_path,
                      {"name": "chat", "kind": "slack", "url": "${env:SLACK}", "bearer": "${env:TOKEN}",
                       "events": ["pass_failed"]},
                      {"name": "chat", "kind": "webhook", "url": "https://a.example.com/", "events": ["pass_failed"]})
    assert "bearer and header are for webhook targets" in message
    assert "two targets are named 'chat'" in message
    assert "bearer-token" not in message


def test_plain_http_carries_no_secret_beyond_loopback(tmp_path: Path) -> None:
    message = refused(tmp_path, {"name": "ops", "kind": "webhook", "url": "http://alerts.example.com/x",
                                 "bearer": "${env:TOKEN}", "events": ["pass_failed"]})
    assert "clear text over http to alerts.example.com" in message
    assert config(tmp_path, {"name": "ops", "kind": "webhook", "url": "http://127.0.0.1:9/x", "bearer": "${env:TOKEN}",
                             "events": ["pass_failed"]}).notifications.targets
    assert config(tmp_path, {"name": "ops", "kind": "webhook", "url": "http://alerts.example.com/x",
                             "events": ["pass_failed"]}).notifications.targets  # nothing secret in it


def test_unknown_events_and_missing_references_are_named(tmp_path: Path) -> None:
    message = refused(tmp_path, {"name": "ops", "kind": "webhook", "url": "https://a.example.com/",
                                 "events": ["pass_broken"]})
    assert "/notifications/targets/0/events/0" in message and "pass_broken" in message
    message = refused(tmp_path, {"name": "chat", "kind": "slack", "url": "${env:NOT_SET}", "events": ["pass_failed"]})
    assert "/notifications/targets/0/url" in message and "NOT_SET" in message


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest/meta-data/", "https://169.254.10.1/hook",
                                 "http://[fe80::1]/hook", "http://[::ffff:169.254.169.254]/hook"])
def test_a_receiver_on_a_link_local_address_is_refused(tmp_path: Path, url: str) -> None:
    message = refused(tmp_path, {"name": "ops", "kind": "webhook", "url": url, "events": ["pass_failed"]})
    assert "link-local" in message and "/notifications/targets/0/url" in message


def test_a_receiver_elsewhere_is_accepted(tmp_path: Path) -> None:
    for url in ("http://127.0.0.1:9/hook", "https://10.0.0.5/hook", "https://hooks.example.com/x"):
        assert config(tmp_path, {"name": "ops", "kind": "webhook", "url": url, "events": ["pass_failed"]})
