"""The box JSON's names and the rules the control plane and the installer both apply to them.

The shape is the box contract's (summarised in docs/wire-formats.md);
`revision`, per-server `digest` and `listen_host`, and the box gateway (`gateway`) are fleetllm's
additions, optional so that an llmao control plane still works.
"""

from __future__ import annotations

import re

from fleetllm_contract import vllmflags

# `\Z`, not `$`: Python's `$` also matches before a final newline, so `"small\n"` would pass `^...$`.
# A server's (and a Supervisor program's) name.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
# Bearers go into Supervisor's `environment=`, whose parser cannot escape: a strict alphabet instead.
BEARER = re.compile(r"^[A-Za-z0-9_.+/=:@-]{8,512}\Z")
# Flags whose value fleetllm decides, in every spelling vLLM reads as one of them (vllmflags.py).
MANAGED_FLAGS = frozenset(vllmflags.MANAGED_FLAGS)

# The box gateway's credentials: file names in the directory the gateway's program gets as
# $CREDENTIALS_DIRECTORY, referenced from its config as ${cred:NAME}.
CLIENT_TOKEN_CREDENTIAL = "client-token"  # noqa: S105 - a file name, not a secret
GATEWAY_PROGRAM = "gateway"  # the gateway's process name: a server may not take it on a gateway box
AGENT_PROGRAM = "agent"  # the box agent's process name: a server may not take it on a box with an agent
AGENT_POLL_S = (5, 3600)  # the box agent's poll interval bounds (fleet.yaml rollout.poll_s)


def bearer_credential(server: str) -> str:
    """The credential holding a server's bearer, which the gateway injects for it."""
    return f"bearer-{server}"


def unsafe_token(token: str) -> str | None:
    """Why an argv element cannot go into Supervisor's `command=`, or None (validation and the installer
    ask the same)."""
    if any(ord(ch) < 32 or ch in "\x7f\u2028\u2029\x85" for ch in token):
        return "holds a control character or line break"
    if not token.isascii():  # supervisord reads its files in the locale's encoding, which may not be UTF-8
        return "holds a non-ASCII character"
    return None
