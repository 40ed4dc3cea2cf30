"""Subcommands of `llmfleet`: thin adapters between argparse and the pure core."""
