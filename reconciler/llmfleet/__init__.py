"""llmfleet control plane: fleet repository model, config server, reconciler."""

from llmfleet_contract.version import __version__

__all__ = ["__version__"]
