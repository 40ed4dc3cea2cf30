"""Box side of llmfleet. Standard library only: this package runs on a stock vLLM container."""

from llmfleet_contract.version import __version__

__all__ = ["__version__"]
