"""fleetllm control plane: fleet repository model, config server, reconciler."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    """`fleetllm.__version__`, from the one place it is written (fleetllm_contract.version), read when asked:
    importing a module of this package with only reconciler/ on sys.path (tests/support/fake_nvidia_smi.py
    run by a bare python3) needs nothing else."""
    if name == "__version__":
        from fleetllm_contract.version import __version__

        return __version__
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
