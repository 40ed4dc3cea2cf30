"""nvidia-smi parsing and probing (with the fake nvidia-smi on PATH), free disk, cached weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetllm_installer.hardware import ProbeError, cached_weights_gb, free_disk_gb, parse_gpus, probe_gpus


def test_parse_two_gpus() -> None:
    gpus = parse_gpus("0, GPU-5f3c, NVIDIA H100 80GB HBM3, 81559, 4, 81080\n"
                      "1, GPU-9ab1, NVIDIA H100 80GB HBM3, 81559, 4, 81080\n")
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[1].memory_total_mib == 81559
    assert gpus[0].name == "NVIDIA H100 80GB HBM3"


def test_parse_header_units_and_not_available() -> None:
    text = ("index, uuid, name, memory.total [MiB], memory.used [MiB], memory.free [MiB]\n"
            "0, GPU-1, NVIDIA A10, 23028 MiB, [N/A], [N/A]\n")
    (only,) = parse_gpus(text)
    assert only.memory_total_mib == 23028
    assert only.memory_free_mib == 0


@pytest.mark.parametrize(("text", "message"), [
    ("", "lists no GPU"),
    ("0, GPU-1, A10\n", "has 3 fields"),
    ("x, GPU-1, A10, 1, 1, 1\n", "is not a number"),
    ("0, GPU-1, A10, [Not Supported], 1, 1\n", "no memory.total"),
])
def test_parse_errors(text: str, message: str) -> None:
    with pytest.raises(ProbeError, match=message):
        parse_gpus(text)


def test_probe_through_the_fake_nvidia_smi(box_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVIDIA_SMI_GPUS", "NVIDIA A10:23028:20000;NVIDIA A10:23028:100")
    gpus = probe_gpus()
    assert [(g.index, g.memory_total_mib, g.memory_free_mib) for g in gpus] == [(0, 23028, 20000), (1, 23028, 100)]


def test_probe_driver_unreachable(box_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVIDIA_SMI_EXIT", "9")
    with pytest.raises(ProbeError, match=r"exit code 9.*couldn't communicate with the NVIDIA driver"):
        probe_gpus()


def test_probe_without_nvidia_smi(box_env: Path, tool_bin: Path) -> None:
    (tool_bin / "nvidia-smi").unlink()
    with pytest.raises(ProbeError, match="nvidia-smi is not on PATH"):
        probe_gpus()


def test_free_disk_of_a_path_not_yet_created(tmp_path: Path) -> None:
    assert free_disk_gb(tmp_path / "not" / "yet") > 0


def test_cached_weights_count_blobs_once(tmp_path: Path) -> None:
    model = tmp_path / "hub" / "models--org--m"
    (model / "blobs").mkdir(parents=True)
    (model / "snapshots" / "abc").mkdir(parents=True)
    (model / "blobs" / "b1").write_bytes(b"x" * 1024 ** 2)
    (model / "snapshots" / "abc" / "model.safetensors").symlink_to(model / "blobs" / "b1")
    assert cached_weights_gb(tmp_path, "org/m") == pytest.approx(1 / 1024)
    assert cached_weights_gb(tmp_path, "org/other") == 0
    assert cached_weights_gb(tmp_path, "/abs/path/model") == 0
