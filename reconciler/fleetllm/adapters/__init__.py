"""Adapters to outside systems: git, HTTP (probes, providers, LiteLLM), the state store."""
