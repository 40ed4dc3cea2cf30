"""Subcommands of `fleetllm`: thin adapters between argparse and the pure core."""
