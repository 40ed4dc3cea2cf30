"""Box side of llmfleet. Standard library only: this package runs on a stock vLLM container."""
