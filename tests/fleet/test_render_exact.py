"""What mutation testing (docs/testing.md) found unpinned in fleetllm.core.fleet.render: the boot digest's
exact value (the bearer enters only as its fingerprint), the legacy error's text, and render_all."""

from __future__ import annotations

import hashlib
import json

import pytest

from fleetllm.core.fleet.bearer import Salt, bearer_fingerprint
from fleetllm.core.fleet.render import Bearers, RenderError, boot_digest, render_all, render_box
from tests.conftest import TEST_LEGACY_KEY, TEST_SALT
from tests.fleet.test_render import example_fleet

BEARERS = Bearers(Salt(TEST_SALT), TEST_LEGACY_KEY)


def test_boot_digest_golden() -> None:
    entry = {"name": "m", "port": 8001, "api_key": "sk-vllm-x", "digest": "sha256:old", "max_model_len": 4096}
    boot = {"name": "m", "port": 8001, "max_model_len": 4096, "api_key_fingerprint": bearer_fingerprint("sk-vllm-x")}
    expected = hashlib.sha256(json.dumps(boot, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert boot_digest(entry) == "sha256:" + expected  # type: ignore[arg-type]


def test_every_server_entry_carries_its_digest() -> None:
    doc = render_box(example_fleet(), "203.0.113.10", BEARERS)
    for entry in doc["servers"]:  # type: ignore[union-attr]
        assert entry["digest"] == boot_digest(entry)  # type: ignore[index, arg-type]
        assert "listen_host" not in entry  # type: ignore[operator]  # no gateway on this box


def test_the_legacy_error_says_what_to_pass() -> None:
    with pytest.raises(RenderError) as info:
        render_box(example_fleet(), "198.51.100.23", Bearers(Salt(TEST_SALT)))
    assert str(info.value) == ("server llama3.1-8b on 198.51.100.23:8000 is a legacy pair and uses the shared legacy "
                               "key: pass --legacy-key-file or set FLEETLLM_LEGACY_API_KEY")


def test_render_all_reports_and_leaves_out_what_cannot_render() -> None:
    fleet = example_fleet()
    everything = render_all(fleet, BEARERS)
    assert list(everything) == list(fleet.boxes)
    assert everything["203.0.113.10"] == render_box(fleet, "203.0.113.10", BEARERS)
    failed: list[tuple[str, str]] = []
    partial = render_all(fleet, Bearers(Salt(TEST_SALT)), lambda name, exc: failed.append((name, str(exc))))
    assert list(partial) == [name for name in fleet.boxes if name != "198.51.100.23"]
    assert [name for name, _ in failed] == ["198.51.100.23"]
    assert "is a legacy pair" in failed[0][1]
    with pytest.raises(RenderError):
        render_all(fleet, Bearers(Salt(TEST_SALT)))


def test_numbers_stay_integral_only_when_they_are() -> None:
    from fleetllm.core.fleet.render import _number

    assert _number(0.9) == 0.9
    assert _number(18.0) == 18 and isinstance(_number(18.0), int)
    assert _number(7) == 7
