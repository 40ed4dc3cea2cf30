"""Credentials on requests: the fleet key, admin and viewer tokens, GitHub webhook signatures; and the
roles they grant (fleetllm.server.access checks them on every guarded view).

Every comparison is constant-time over SHA-256 digests, so neither content nor length leaks by timing.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from enum import StrEnum

from fleetllm.core.secret import Secret


class Role(StrEnum):
    """Who a request may act as. An admin may do everything a viewer may."""

    FLEET = "fleet"  # a box: the fleet key (the box contract's /vllm/* endpoints)
    VIEWER = "viewer"  # reads the status pages, their API and the admin API's views
    ADMIN = "admin"  # a viewer who may also approve boxes


def bearer_token(authorization: str | None) -> str | None:
    """The token of `Authorization: Bearer <token>` (scheme case-insensitive), else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


def matches(given: str | None, expected: Secret) -> bool:
    return given is not None and hmac.compare_digest(_digest(given), _digest(expected.reveal()))


def matches_any(given: str | None, tokens: Sequence[Secret]) -> bool:
    """Checks every token (no early exit), so timing does not tell which one matched."""
    found = False
    for token in tokens:
        found = matches(given, token) | found
    return found


def token_fingerprint(token: str) -> str:
    """Names a token in audit records without revealing it."""
    return hashlib.sha256(b"fleetllm.token\n" + token.encode()).hexdigest()[:12]


def webhook_signature_ok(secret: Secret, body: bytes, header: str | None) -> bool:
    """GitHub's `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body>`."""
    if not header or not header.startswith("sha256="):
        return False
    expected = "sha256=" + hmac.new(secret.reveal().encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), header.strip().encode("utf-8", "replace"))
