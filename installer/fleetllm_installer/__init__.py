"""Box side of fleetllm. Standard library only: this package runs on a stock vLLM container."""

from fleetllm_contract.version import __version__

__all__ = ["__version__"]
