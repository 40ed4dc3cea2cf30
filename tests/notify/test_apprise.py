"""Apprise targets (`kind: apprise`): the config takes an Apprise URL as a secret reference and refuses
what Apprise cannot send to, or would send in clear beyond loopback, without quoting it; the sender hands
each notification to Apprise in its sender thread with the same retries, over real HTTP to a receiver on
loopback: Apprise's generic json:// scheme, and a service scheme (Mattermost's mmost://, whose host is the
operator's own server) pointed at the receiver. No part of the URL reaches a log line."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from fleetllm.adapters.notify import apprise_problem, apprise_url_parts
from fleetllm.core.notify import Event, EventKind, Target, TargetKind
from fleetllm.core.secret import Secret
from fleetllm.errors import ConfigurationError
from fleetllm.settings import ControlPlaneConfig, load_config
from tests.notify.receiver import Receiver, receiving
from tests.notify.test_delivery import logs, notifier, value  # noqa: F401  # logs: a fixture
from tests.server.conftest import LogCapture

TOKEN = "mmhooktoken7Qz4Lw9Xc2"  # Mattermost's incoming-webhook id: the credential in the URL's path
ALL = frozenset(EventKind)


def apprise_target(url: str, name: str = "team") -> Target:
    return Target(name, TargetKind.APPRISE, Secret(url, "${env:APPRISE_URL}"), ALL)


def json_url(receiver: Receiver, path: str = "/apprise") -> str:
    where = urlsplit(receiver.url)
    return f"json://{where.hostname}:{where.port}{path}"


def test_json_scheme_reaches_a_real_receiver_with_a_title_and_a_text(logs: LogCapture) -> None:  # noqa: F811
    with receiving() as receiver:
        sender, registry = notifier([apprise_target(json_url(receiver))])
        sender.emit(Event(EventKind.PASS_FAILED, "failed", "LiteLLM did not answer the listing",
                          details={"errors": ["LiteLLM listing: timeout"], "revision": "0eda6e1a"}))
        (got,) = receiver.wait_for(1, "/apprise")
        sender.settle(EventKind.PASS_FAILED, [], among={"failed"})  # it cleared: the resolved form
        (_, resolved) = receiver.wait_for(2, "/apprise")
        assert sender.close(10)
    assert got.body["title"] == "[CRITICAL] Reconcile pass failed: failed"
    assert got.body["type"] == "failure" and got.body["message"].startswith("LiteLLM did not answer the listing")
    assert "errors: LiteLLM listing: timeout" in got.body["message"] and "pass_failed:failed" in got.body["message"]
    assert "fleetllm control-plane on test · new · since " in got.body["message"]
    assert resolved.body["title"].startswith("[RESOLVED] Reconcile pass failed") and resolved.body["type"] == "success"
    assert value(registry, "fleetllm_notifications_sent_total", target="team", kind="pass_failed") == 2
    assert [e["target"] for e in logs.events("notification sent")] == ["team", "team"]
    assert str(urlsplit(receiver.url).port) not in logs.text and "/apprise" not in logs.text


def test_every_kind_has_an_apprise_type() -> None:
    """A notice is `info` (rollout_started, converged) or `warning` (rolled_back); none is ever resolved."""
    from fleetllm.adapters.notify import APPRISE_TYPES
    from fleetllm.core.notify import NOTICES, SEVERITY

    for kind in EventKind:
        assert ("firing", SEVERITY[kind]) in APPRISE_TYPES, kind
        assert kind in NOTICES or ("resolved", SEVERITY[kind]) in APPRISE_TYPES, kind
    assert APPRISE_TYPES[("firing", SEVERITY[EventKind.CONVERGED])] == "info"


def test_a_service_scheme_pointed_at_a_local_server(logs: LogCapture) -> None:  # noqa: F811
    """mmost:// is Mattermost's incoming webhook (POST /hooks/TOKEN, a JSON `text`): the receiver stands
    in for the operator's Mattermost server on loopback."""
    with receiving() as receiver:
        where = urlsplit(receiver.url)
        sender, _ = notifier([apprise_target(f"mmost://{where.hostname}:{where.port}/{TOKEN}", "chat")])
        sender.emit(Event(EventKind.MODEL_WITHOUT_SERVERS, "qwen3-8b", "no server of qwen3-8b serves"))
        (got,) = receiver.wait_for(1, f"/hooks/{TOKEN}")
        assert sender.close(10)
    assert "[CRITICAL] Model without servers: qwen3-8b" in got.body["text"]
    assert "no server of qwen3-8b serves" in got.body["text"]
    assert TOKEN not in logs.text and logs.events("notification sent")[0]["target"] == "chat"


def test_failures_are_retried_then_given_up_without_any_part_of_the_url(logs: LogCapture) -> None:  # noqa: F811
    with receiving(script=[503, 200, 500, 500]) as receiver:
        where = urlsplit(receiver.url)
        sender, registry = notifier([apprise_target(f"mmost://{where.hostname}:{where.port}/{TOKEN}")],
                                    attempts=2)
        sender.emit(Event(EventKind.INVALID_COMMIT, "main", "commit 0eda6e1 is invalid", fingerprint="0eda6e1"))
        receiver.wait_for(1)  # after a 503, retried
        sender.emit(Event(EventKind.ROLLOUT_HALTED, "r-9", "rollout r-9 halted"))
        assert sender.close(20)
    assert [r.status for r in receiver.received] == [503, 200, 500, 500]
    assert value(registry, "fleetllm_notifications_retries_total", target="team") == 2
    assert value(registry, "fleetllm_notifications_sent_total", target="team", kind="invalid_commit") == 1
    assert value(registry, "fleetllm_notifications_failed_total", target="team", kind="rollout_halted") == 1
    (failure,) = logs.events("notification not delivered")
    assert failure["attempts"] == 2 and "Apprise could not send it" in failure["error"]
    for part in (TOKEN, str(where.port), f"{where.hostname}:{where.port}"):
        assert part not in logs.text


def test_sending_holds_up_no_emit(logs: LogCapture) -> None:  # noqa: F811
    """While the receiver answers nothing, every emit returns (the sends wait in the sender's thread)."""
    gate = threading.Event()
    with receiving(gate=gate) as held:
        sender, registry = notifier([apprise_target(json_url(held))], timeout_s=30.0)
        for i in range(20):
            sender.emit(Event(EventKind.ROLLOUT_HALTED, f"r-{i}", "halted"))
        assert held.received == [] and not sender.drain(0)  # all emitted, none answered, still sending
        gate.set()
        held.wait_for(20)
        assert sender.close(20)
    assert value(registry, "fleetllm_notifications_sent_total", target="team", kind="rollout_halted") == 20


HELD_SENDER = """
import sys
from fleetllm.adapters.notify import Delivery, Notifier
from fleetllm.adapters.state.notifications import MemoryLedger
from fleetllm.core.notify import Event, EventKind, Target, TargetKind
from fleetllm.core.secret import Secret

target = Target("team", TargetKind.APPRISE, Secret(sys.argv[1], "${env:U}"), frozenset(EventKind))
sender = Notifier([target], Delivery(3600.0, 120.0, 1, 10, True), MemoryLedger(), component="reconciler",
                  instance="held")
sender.emit(Event(EventKind.PASS_FAILED, "failed", "the pass failed"))
sys.stdin.readline()  # the test says when the request is at the receiver
print("sent" if sender.close(0.5) else "left", flush=True)
"""


def test_a_receiver_that_never_answers_does_not_hold_up_the_exit() -> None:
    """`reconcile --once` ends with close(drain_timeout_s): a send still waiting on its receiver then is
    left behind, and the process exits while the receiver still holds the request."""
    gate = threading.Event()
    with receiving(gate=gate) as held:
        child = subprocess.Popen([sys.executable, "-c", HELD_SENDER, json_url(held)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while held.arrived == 0:
                assert time.monotonic() < deadline and child.poll() is None, "the send never reached the receiver"
                time.sleep(0.05)
            out, err = child.communicate("go\n", timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
        assert (child.returncode, out.strip()) == (0, "left"), err
        assert held.received == []  # it exited with the request still held
        gate.set()


# The config.

ENV = {"SALT": "salt-0123456789abcdef"}


def config(tmp_path: Path, url: str, **target: Any) -> ControlPlaneConfig:
    document = {"repo": {"path": str(tmp_path)}, "secrets": {"vllm_api_salt": "${env:SALT}"},
                "state": {"url": "sqlite:///state.db"},
                "notifications": {"targets": [{"name": "team", "kind": "apprise", "url": "${env:AURL}",
                                               "events": ["pass_failed"], **target}]}}
    path = tmp_path / "cp.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_config(path, {**ENV, "AURL": url})


def refused(tmp_path: Path, url: str, **target: Any) -> str:
    with pytest.raises(ConfigurationError) as caught:
        config(tmp_path, url, **target)
    message = str(caught.value)
    for part in apprise_url_parts(url):
        assert part not in message, part
    return message


def test_the_config_takes_an_apprise_url_from_a_reference(tmp_path: Path) -> None:
    secret_url = "discord://4174216298/JHMHI8qBe7bk2ZwO5U711o3dV_tokenA9d"
    (target,) = config(tmp_path, secret_url).notifications.targets
    assert (target.kind, target.url.reveal(), target.url.reference) == (TargetKind.APPRISE, secret_url,
                                                                        "${env:AURL}")
    assert "tokenA9d" not in repr(target)
    assert config(tmp_path, f"json://127.0.0.1:9/{TOKEN}").notifications.targets  # clear text on loopback
    assert config(tmp_path, f"jsons://alerts.example.com/{TOKEN}").notifications.targets


def test_the_config_refuses_what_apprise_cannot_use_without_quoting_it(tmp_path: Path) -> None:
    message = refused(tmp_path, f"nosuchservice://{TOKEN}@example.com/x")
    assert "/notifications/targets/0/url" in message and "scheme 'nosuchservice'" in message
    assert "${env:AURL}" in message
    assert "no scheme://" in refused(tmp_path, f"hooks.example.com/{TOKEN}")
    message = refused(tmp_path, f"mmost://chat.example.com/{TOKEN}")
    assert "mmost:// sends in clear text" in message and "use mmosts://" in message
    assert "use jsons://" in refused(tmp_path, f"json://alerts.example.com/{TOKEN}")
    assert "bearer and header are for webhook targets" in refused(
        tmp_path, f"jsons://alerts.example.com/{TOKEN}", bearer="${env:SALT}")
    document = {"repo": {"path": str(tmp_path)}, "secrets": {"vllm_api_salt": "${env:SALT}"},
                "notifications": {"targets": [{"name": "t", "kind": "apprise", "url": "jsons://a.example/x",
                                               "events": ["pass_failed"]}]}}
    (tmp_path / "cp.yaml").write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigurationError, match="secret reference"):  # written in the file: refused by the schema
        load_config(tmp_path / "cp.yaml", ENV)


def test_apprise_problem_and_url_parts() -> None:
    assert apprise_problem("discord://1234567/abcdefTOKEN") is None
    assert apprise_problem("mmost://127.0.0.1:8065/abc") is None
    parts = apprise_url_parts("tgram://123456:BOTtoken@x/chat%2Did?key=v4lue")
    assert {"123456", "BOTtoken", "chat%2Did", "chat-id", "v4lue"} <= set(parts)
