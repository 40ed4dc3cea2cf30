"""The box JSON's names and the rules the control plane and the installer both apply to them.

The shape is the box contract's (summarised in docs/wire-formats.md);
`revision`, per-server `digest` and `listen_host`, and the box gateway (`gateway`) are llmfleet's
additions, optional so that an llmao control plane still works.
"""

from __future__ import annotations

import re

# A server's (and a Supervisor program's) name.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# Bearers go into Supervisor's `environment=`, whose parser cannot escape: a strict alphabet instead.
BEARER = re.compile(r"^[A-Za-z0-9_.+/=:@-]{8,512}$")
# Flags whose value llmfleet decides: where the server listens, what it is called, how much of the
# card and context it takes, and its bearer. A recipe that sets one would break the contract (and
# --api-key would put the bearer on the command line, readable in /proc/*/cmdline).
MANAGED_FLAGS = frozenset({
    "port", "host", "uds", "served-model-name", "max-model-len", "gpu-memory-utilization", "api-key",
})

# The box gateway's credentials: file names in the directory the gateway's program gets as
# $CREDENTIALS_DIRECTORY, referenced from its config as ${cred:NAME}.
CLIENT_TOKEN_CREDENTIAL = "client-token"  # noqa: S105 - a file name, not a secret
GATEWAY_PROGRAM = "gateway"  # the gateway's process name: a server may not take it on a gateway box


def bearer_credential(server: str) -> str:
    """The credential holding a server's bearer, which the gateway injects for it."""
    return f"bearer-{server}"
