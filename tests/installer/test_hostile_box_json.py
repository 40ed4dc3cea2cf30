"""A malicious or broken control plane: every box JSON gets a clear refusal and a report, never a traceback.

Issue 16, finding 10: a bearer ending in a newline passed the installer's `^...$` check (Python's `$`
matches before a final newline) and broke the Supervisor program; `vram_gb: 1e308` and
`max_model_len: 10**400` ended in an uncaught OverflowError with no report. The class, fuzzed, is in
tests/faults/test_fuzz.py (test_the_installer_refuses_or_installs_any_box_json).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from fleetllm_installer.boxjson import BoxJsonError, parse_box, parse_text
from fleetllm_installer.fit import gpus_needed
from fleetllm_installer.main import main
from tests.installer.conftest import BOX, FakeControlPlane


@pytest.fixture
def env(box_env: Path, control_plane: FakeControlPlane, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEETLLM_URL", control_plane.url)
    return box_env


def changed(box_json: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    document = copy.deepcopy(box_json)
    document["servers"][0][field] = value
    return document


BEARER_NL = "sk-vllm-abcdefgh\n"
HOSTILE_FIELDS = [
    ("api_key", BEARER_NL, "servers[0].api_key: expected 8-512 characters"),
    ("api_key", "sk-vllm-abcdefgh\r", "servers[0].api_key"),
    ("name", "large\n", "servers[0].name"),
    ("served_model_name", "org/x\n", "servers[0].served_model_name"),
    ("model", "org/x\n", "servers[0].model"),
    ("vram_gb", 1e308, "servers[0].vram_gb: expected a number 0-1000000"),
    ("disk_gb", 1e308, "servers[0].disk_gb"),
    ("max_model_len", 10**400, "servers[0].max_model_len: expected an integer 1-16777216"),
    ("kv_bytes_per_token", 10**30, "servers[0].kv_bytes_per_token"),
    ("digest", "sha256:x\n", "servers[0].digest"),
    ("digest", "x" * 10_000, "servers[0].digest"),
    # issue 27: the positional model and --served-model-name's value are vLLM options when they start with
    # '-' (`vllm serve --api-key=X` bypassed the managed-flag rule); --config reads flags from a box file
    ("model", "--api-key=sk-vllm-abcdefgh", "servers[0].model: starts with '-'"),
    ("model", "-h", "servers[0].model: starts with '-'"),
    ("served_model_name", "--api-key=sk-vllm-abcdefgh", "servers[0].served_model_name: starts with '-'"),
    ("args", ["--config", "/etc/vllm.yaml"], "servers[0].args[0]: --config is refused"),
    ("args", ["--dtype", "half", "--conf=/root/x.yaml"], "servers[0].args[2]: --conf would be read by vLLM as --config"),
    ("args", ["--tensor-parallel-size", "²"], None),  # "²".isdigit() but int("²") fails: ignored, not a crash
    ("args", ["--tensor-parallel-size=" + "9" * 5000], None),
]


@pytest.mark.parametrize(("field", "value", "message"), HOSTILE_FIELDS)
def test_a_hostile_field_is_refused_by_name_or_harmless(box_json: dict[str, Any], field: str, value: Any,
                                                        message: str | None) -> None:
    document = changed(box_json, field, value)
    if message is None:
        box = parse_box(document, BOX)
        assert all(gpus_needed(s.args) >= 1 for s in box.servers)
        return
    with pytest.raises(BoxJsonError) as caught:
        parse_box(document, BOX)
    text = " ".join(caught.value.problems)
    assert message in text and "abcdefgh" not in text and len(text) < 2000


HOSTILE_TEXTS = [
    ('{"host": "box-a", "servers": [], "revision": ' + "9" * 5000 + "}", "not usable JSON"),
    ('{"host": "box-a", "servers": [{"vram_gb": NaN}]}', "NaN is not a JSON number"),
    ('{"host": "box-a", "servers": [{"vram_gb": Infinity}]}', "Infinity is not a JSON number"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"host": "box-a", "servers": [], "gateway": ' + "[" * 70 + "]" * 70 + "}", "nested too deeply"),
    ('{"host": "box-a", "servers": [' + ",".join(["{}"] * 65) + "]}", "a box runs at most 64"),
]


@pytest.mark.parametrize(("text", "message"), HOSTILE_TEXTS)
def test_hostile_json_text_is_refused(text: str, message: str) -> None:
    with pytest.raises(BoxJsonError) as caught:
        parse_text(text, BOX)
    assert message in " ".join(caught.value.problems)


@pytest.mark.parametrize(("field", "value", "message"), [case for case in HOSTILE_FIELDS if case[2] is not None])
def test_the_installer_refuses_and_reports(env: Path, control_plane: FakeControlPlane, box_json: dict[str, Any],
                                           capsys: pytest.CaptureFixture[str], field: str, value: Any,
                                           message: str) -> None:
    document = changed(box_json, field, value)
    control_plane.raw_config = json.dumps(document).encode()
    assert main(["--handover", "none"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and message in err and BEARER_NL.strip() not in err
    assert not (env.parent / "conf.d").exists()
    (report,) = control_plane.reports
    assert report["outcome"] == "failed" and message in report["message"]


@pytest.mark.parametrize(("text", "message"), HOSTILE_TEXTS[:4])
def test_the_installer_refuses_hostile_text_and_reports(env: Path, control_plane: FakeControlPlane,
                                                        capsys: pytest.CaptureFixture[str], text: str,
                                                        message: str) -> None:
    control_plane.raw_config = text.encode()
    assert main(["--handover", "none"]) == 1
    assert "Traceback" not in capsys.readouterr().err
    (report,) = control_plane.reports
    assert report["outcome"] == "failed" and message in report["message"]


def test_a_bearer_ending_in_a_newline_never_reaches_a_dry_run(env: Path, control_plane: FakeControlPlane,
                                                              box_json: dict[str, Any],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    control_plane.raw_config = json.dumps(changed(box_json, "api_key", BEARER_NL)).encode()
    assert main(["--dry-run", "--assume-gpus", "1x80", "--handover", "none"]) == 1
    out = capsys.readouterr().out
    assert "VLLM_API_KEY" not in out  # refused before anything is rendered, not hidden behind the redaction


def test_a_unicode_digit_retry_after_is_ignored_not_a_crash() -> None:
    import email.message
    import urllib.error

    from fleetllm_installer.fetch import Client, _RetryableError

    headers = email.message.Message()
    headers["Retry-After"] = "²"  # "²".isdigit() is True, float("²") raises
    error = urllib.error.HTTPError("http://127.0.0.1/vllm/config", 429, "Too Many", headers, None)
    found = Client("http://127.0.0.1:1", "k" * 16, BOX)._status_error(error, "/vllm/config")
    assert isinstance(found, _RetryableError) and found.retry_after is None


def test_a_control_plane_speaking_garbage_is_a_clear_failure() -> None:
    import socket
    import threading

    from fleetllm_installer.fetch import Client, FetchError

    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        for _ in range(3):
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    client = Client(f"http://127.0.0.1:{listener.getsockname()[1]}", "k" * 16, BOX, deadline_s=0)
    try:
        with pytest.raises(FetchError, match="cannot reach"):
            client.fetch_config()
    finally:
        listener.close()
