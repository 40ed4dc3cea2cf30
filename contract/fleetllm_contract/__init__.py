"""The box contract, written once: what the control plane renders, the installer checks and the gateway
reads. Standard library only (it ships in the box zipapp and runs with `python3 -S`).

- `boxjson`: the box JSON's names and the rules both sides apply to them (names, bearers, the flags
  fleetllm manages, the gateway's credentials).
- `secretref`: `${env:NAME}`, `${file:PATH}` and `${cred:NAME}` secret references.
- `addresses`: host and address helpers (IPv4-mapped IPv6, loopback).
- `logfmt`: the one log format (JSON lines) of every fleetllm process.
- `sdnotify`: systemd's readiness protocol, for `fleetllm serve` and the box gateway.
- `version`: fleetllm's one version.
"""

from fleetllm_contract.version import __version__

__all__ = ["__version__"]
