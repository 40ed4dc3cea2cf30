"""Where the CLI's operator commands find the control plane and the admin token, and how they fail: a
clear sentence, never the token, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetllm.adapters.admin_client import AdminApiError, AdminClient, admin_token, control_plane_url
from fleetllm.cli.main import main
from fleetllm.core.secret import Secret
from fleetllm.errors import ConfigurationError

TOKEN = "admin-token-never-printed-0123456789"


def test_the_url_comes_from_the_flag_or_the_environment() -> None:
    assert control_plane_url("https://cp.example:8443/", {}) == "https://cp.example:8443"
    assert control_plane_url(None, {"FLEETLLM_URL": "http://127.0.0.1:8080"}) == "http://127.0.0.1:8080"
    with pytest.raises(ConfigurationError, match="give --url https://HOST:PORT or set FLEETLLM_URL"):
        control_plane_url(None, {})
    with pytest.raises(ConfigurationError, match=r"plain http to cp\.example would send the credential in clear"):
        control_plane_url("http://cp.example:8080", {})
    with pytest.raises(ConfigurationError, match="give an https:// URL"):
        control_plane_url("ftp://cp.example", {})


def test_the_token_comes_from_a_file_or_the_environment_never_the_command_line(tmp_path: Path) -> None:
    file = tmp_path / "token"
    file.write_text(TOKEN + "\n")
    assert admin_token(str(file), {}).reveal() == TOKEN
    assert admin_token(None, {"FLEETLLM_ADMIN_TOKEN": TOKEN}).reveal() == TOKEN
    assert TOKEN not in repr(admin_token(None, {"FLEETLLM_ADMIN_TOKEN": TOKEN}))
    with pytest.raises(ConfigurationError, match="never the token itself"):
        admin_token(None, {})
    reading = ("FLEETLLM_ADMIN_TOKEN", "FLEETLLM_VIEWER_TOKEN")  # `rollout status` and `wait` only read
    assert admin_token(None, {"FLEETLLM_VIEWER_TOKEN": TOKEN}, reading).reference == "$FLEETLLM_VIEWER_TOKEN"
    assert admin_token(None, {"FLEETLLM_ADMIN_TOKEN": "a" * 30, "FLEETLLM_VIEWER_TOKEN": TOKEN},
                       reading).reveal() == "a" * 30
    with pytest.raises(ConfigurationError, match="FLEETLLM_ADMIN_TOKEN or FLEETLLM_VIEWER_TOKEN"):
        admin_token(None, {}, reading)
    with pytest.raises(ConfigurationError, match="set FLEETLLM_ADMIN_TOKEN "):
        admin_token(None, {"FLEETLLM_VIEWER_TOKEN": TOKEN})  # an operator's action: the viewer's is not looked at
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigurationError, match="is empty"):
        admin_token(str(tmp_path / "empty"), {})


def test_an_unreachable_control_plane_is_one_sentence(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    client = AdminClient("http://127.0.0.1:9", Secret(TOKEN, "test"), timeout_s=5)
    with pytest.raises(AdminApiError, match="cannot reach the control plane") as caught:
        client.call("POST", "/admin/sync", {})
    assert TOKEN not in str(caught.value)
    monkeypatch.setenv("FLEETLLM_ADMIN_TOKEN", TOKEN)
    assert main(["suspend", "--url", "http://127.0.0.1:9", "--reason", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fleetllm suspend: POST http://127.0.0.1:9/admin/suspend: cannot reach the control plane")
    assert TOKEN not in err and "Traceback" not in err
