"""I/O adapters of the reconciler: provider listings, server probes, the LiteLLM model API, and the
observer that runs them with timeouts, bounded concurrency and retries."""
