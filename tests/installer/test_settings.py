"""Settings from the environment: each missing or bad variable is named, legacy names work."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetllm_installer.settings import SettingsError, load

BASE = {"LLMAO_HOST": "203.0.113.10", "FLEETLLM_URL": "https://fleet.example.org/", "FLEETLLM_FLEET_KEY": "k" * 20}


@pytest.mark.parametrize("missing", ["LLMAO_HOST", "FLEETLLM_URL", "FLEETLLM_FLEET_KEY"])
def test_missing_variable_is_named(missing: str) -> None:
    env = {k: v for k, v in BASE.items() if k != missing}
    with pytest.raises(SettingsError, match=missing):
        load(env)


def test_blank_counts_as_missing() -> None:
    with pytest.raises(SettingsError, match=r"FLEETLLM_FLEET_KEY .or the legacy FLEET_KEY. is not set"):
        load({**BASE, "FLEETLLM_FLEET_KEY": "  "})


def test_legacy_names_are_accepted() -> None:
    settings = load({"LLMAO_HOST": "h", "ASFQUART_URL": "https://cp.example.org", "FLEET_KEY": "legacy-key",
                     "DATA_DIRECTORY": "/data", "SUPERVISOR_CONF_DIR": "/etc/sv", "VLLM_BIN": "/opt/vllm"})
    assert settings.url == "https://cp.example.org"
    assert settings.fleet_key == "legacy-key"
    assert settings.data_dir == Path("/data")
    assert settings.conf_dir == Path("/etc/sv")
    assert settings.vllm_bin == "/opt/vllm"
    assert settings.hf_home == Path("/data/hf-cache")


def test_new_names_win_over_legacy() -> None:
    settings = load({**BASE, "FLEET_KEY": "old", "ASFQUART_URL": "https://old.example.org"})
    assert settings.fleet_key == BASE["FLEETLLM_FLEET_KEY"]
    assert settings.url == "https://fleet.example.org"  # trailing slash removed


def test_config_file_mode_needs_no_control_plane() -> None:
    settings = load({}, need_control_plane=False)
    assert settings.host is None
    assert settings.data_dir == Path("/workspace")
    assert settings.conf_dir == Path("/etc/supervisor/conf.d")


@pytest.mark.parametrize("value", ["relative/dir", "/with space", "/pct%dir", "/semi;colon", "/hash#x"])
def test_paths_outside_the_safe_alphabet_are_refused(value: str) -> None:
    with pytest.raises(SettingsError, match="FLEETLLM_DATA_DIR"):
        load({**BASE, "FLEETLLM_DATA_DIR": value})


def test_missing_ca_bundle_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="FLEETLLM_CA_BUNDLE"):
        load({**BASE, "FLEETLLM_CA_BUNDLE": str(tmp_path / "nope.pem")})


def test_bad_number_is_named() -> None:
    with pytest.raises(SettingsError, match="FLEETLLM_STARTSECS='soon' is not a number"):
        load({**BASE, "FLEETLLM_STARTSECS": "soon"})


def test_repr_hides_the_fleet_key() -> None:
    assert BASE["FLEETLLM_FLEET_KEY"] not in repr(load(BASE))
