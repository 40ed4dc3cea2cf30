"""What the box has: its GPUs (nvidia-smi), free disk where weights go, weights already downloaded."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from fleetllm_installer.errors import InstallerError

QUERY = ["--query-gpu=index,uuid,name,memory.total,memory.used,memory.free", "--format=csv,noheader,nounits"]
MIB_PER_GB = 1024  # vram_gb and disk_gb are read as GiB: nvidia-smi's MiB / 1024


class ProbeError(InstallerError, RuntimeError):
    """The box could not be measured (no nvidia-smi, driver unreachable, unreadable output)."""


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total_mib: int
    memory_free_mib: int

    @property
    def total_gb(self) -> float:
        return self.memory_total_mib / MIB_PER_GB


def _mib(field: str) -> int | None:
    field = field.strip().removesuffix("MiB").strip()
    if field.startswith("[") or not field:  # [N/A], [Not Supported]
        return None
    try:
        return int(float(field))
    except ValueError:
        return None


def parse_gpus(text: str) -> tuple[Gpu, ...]:
    """Parse `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` output (a header line is skipped)."""
    gpus = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("index"):
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 6:
            raise ProbeError(f"nvidia-smi line {number} has {len(fields)} fields, expected 6: {line.strip()!r}")
        try:
            index = int(fields[0])
        except ValueError:
            raise ProbeError(f"nvidia-smi line {number}: GPU index {fields[0]!r} is not a number") from None
        total, free = _mib(fields[3]), _mib(fields[5])
        if total is None:
            raise ProbeError(f"nvidia-smi reports no memory.total for GPU {index} ({fields[3]!r})")
        gpus.append(Gpu(index=index, uuid=fields[1], name=", ".join(fields[2:-3]),
                        memory_total_mib=total, memory_free_mib=free if free is not None else 0))
    if not gpus:
        raise ProbeError("nvidia-smi lists no GPU")
    return tuple(sorted(gpus, key=lambda g: g.index))


def probe_gpus(timeout_s: float = 30.0) -> tuple[Gpu, ...]:
    binary = shutil.which("nvidia-smi")
    if binary is None:
        raise ProbeError("nvidia-smi is not on PATH: no NVIDIA driver is visible in this container, "
                         "so the GPU memory cannot be checked")
    try:
        done = subprocess.run([binary, *QUERY], capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise ProbeError(f"nvidia-smi did not answer within {timeout_s:g} s") from None
    except OSError as exc:
        raise ProbeError(f"cannot run nvidia-smi: {exc.strerror}") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise ProbeError(f"nvidia-smi failed with exit code {done.returncode}"
                         + (f": {detail[-1]}" if detail else "") + " (driver unreachable?)")
    return parse_gpus(done.stdout)


def free_disk_gb(path: Path) -> float:
    """Free space on the file system that holds `path` (or its nearest existing parent)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free / (1024 ** 3)


def cached_weights_gb(hf_home: Path, model: str) -> float:
    """Bytes already in the Hugging Face cache for `model` (hub/models--Org--Name), in GiB."""
    if model.startswith("/"):
        return 0.0
    folder = hf_home / "hub" / ("models--" + model.replace("/", "--"))
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            full = os.path.join(root, name)
            if not os.path.islink(full):  # snapshots/ links to blobs/: count each blob once
                try:
                    total += os.stat(full).st_size
                except OSError:
                    continue
    return total / (1024 ** 3)
