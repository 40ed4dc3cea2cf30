"""llmfleet control plane: fleet repository model, config server, reconciler."""

__version__ = "0.1.0"
