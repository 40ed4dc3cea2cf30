"""Box side of llmfleet. Standard library only: this package runs on a stock vLLM container."""

__version__ = "0.1.0"
