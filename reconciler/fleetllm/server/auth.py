"""Credentials on requests: the fleet key, admin, operator and viewer tokens, GitHub webhook signatures;
the roles they grant (fleetllm.server.access checks them on every guarded view), and who a caller is in
the audit trail.

Every comparison is constant-time over SHA-256 digests, so neither content nor length leaks by timing.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from fleetllm.core.secret import Secret, bearer_token, matches
from fleetllm.settings import ApiToken, ControlPlaneConfig


class Role(StrEnum):
    """Who a request may act as. Each person's role covers the ones below it: an admin may do everything an
    operator may, an operator everything a viewer may (`covers`)."""

    FLEET = "fleet"  # a box: the fleet key (the box contract's /vllm/* endpoints); outside the ladder
    VIEWER = "viewer"  # reads the status pages, their API and the admin API's views
    OPERATOR = "operator"  # a viewer who may also sync, suspend, resume, pin, unpin and steer the rollout
    ADMIN = "admin"  # an operator who may also approve boxes


PEOPLE_ROLES = (Role.VIEWER, Role.OPERATOR, Role.ADMIN)  # lowest first: what a token or a login can grant
TOKEN_LISTS = {Role.ADMIN: "admin_tokens", Role.OPERATOR: "operator_tokens", Role.VIEWER: "viewer_tokens"}


def covers(held: Role, wanted: Role) -> bool:
    """Whether holding `held` admits a view that requires `wanted`."""
    if held is Role.FLEET or wanted is Role.FLEET:
        return held is wanted
    return PEOPLE_ROLES.index(held) >= PEOPLE_ROLES.index(wanted)


@dataclass(frozen=True)
class Caller:
    """Who a request acts as: the role granted, and how the audit trail names them (never a token):
    `<role>:<fingerprint>` or `token:<name>` for a token, `<subject> <email>` for a person who signed in."""

    role: Role
    actor: str


def tokens_of(config: ControlPlaneConfig, role: Role) -> tuple[ApiToken, ...]:
    if role is Role.ADMIN:
        return config.admin_tokens
    if role is Role.OPERATOR:
        return config.operator_tokens
    return config.viewer_tokens if role is Role.VIEWER else ()


def all_tokens(config: ControlPlaneConfig) -> tuple[ApiToken, ...]:
    return (*config.admin_tokens, *config.operator_tokens, *config.viewer_tokens)


def token_caller(config: ControlPlaneConfig, token: str | None) -> Caller | None:
    """The caller a configured token stands for (the highest role it is listed under), else None. Every
    token is compared (no early exit), so timing does not tell which one matched."""
    if token is None:
        return None
    found: Caller | None = None
    for role in reversed(PEOPLE_ROLES):
        for configured in tokens_of(config, role):
            if matches(token, configured.secret) and found is None:
                found = Caller(role, token_actor(role, token, configured.name))
    return found


def token_actor(role: Role, token: str, name: str | None) -> str:
    """How the audit trail names a token: its configured name, else its role and fingerprint."""
    return f"token:{name}" if name else f"{role}:{token_fingerprint(token)}"


def person_actor(subject: str, email: str | None) -> str:
    """How the audit trail names a person who signed in: the provider's subject and their email."""
    return f"{subject} <{email}>" if email else subject


def role_for_groups(groups: Iterable[str], mapping: Mapping[str, str]) -> Role | None:
    """The highest role any of `groups` maps to (auth.oidc.roles), else None."""
    granted = [Role(mapping[g]) for g in groups if g in mapping]
    return max(granted, key=PEOPLE_ROLES.index, default=None)


def matches_any(given: str | None, tokens: Sequence[Secret]) -> bool:
    """Checks every token (no early exit), so timing does not tell which one matched."""
    found = False
    for token in tokens:
        found = matches(given, token) | found
    return found


def fleet_key_refusal(config: ControlPlaneConfig, authorization: str | None) -> tuple[int, str] | None:
    """The box contract's key check, for the Flask and the event-loop paths alike: None when
    `authorization` carries the fleet key, else the refusal's status and sentence (503 when no fleet
    key is configured, 403 when it is missing or wrong; a constant-time compare)."""
    key = config.secrets.fleet_key
    if key is None:
        return 503, "this control plane has no fleet key configured (secrets.fleet_key)"
    token = bearer_token(authorization)
    if token is None:
        return 403, "missing fleet key: send Authorization: Bearer <fleet key>"
    if not matches(token, key):
        return 403, "wrong fleet key"
    return None


def token_fingerprint(token: str) -> str:
    """Names a token in audit records without revealing it."""
    return hashlib.sha256(b"fleetllm.token\n" + token.encode()).hexdigest()[:12]


def webhook_signature_ok(secret: Secret, body: bytes, header: str | None) -> bool:
    """GitHub's `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body>`."""
    if not header or not header.startswith("sha256="):
        return False
    expected = "sha256=" + hmac.new(secret.reveal().encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), header.strip().encode("utf-8", "replace"))
