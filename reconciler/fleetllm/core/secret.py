"""`Secret`: a resolved secret (a key, a token, a password) that does not show itself.

The settings (fleetllm.settings) resolve every `${env:}`/`${file:}`/`${cred:}` reference into one, and
it travels as a `Secret` to the constructor of the client that puts it on the wire (the LiteLLM client,
a provider client, the state store's connection): `reveal()` is called there and nowhere above.

A token a request presents is compared with one here (`matches`: constant time), and `metrics_refusal`
is the one check of GET /metrics (`fleetllm serve`'s and `fleetllm reconcile --metrics-listen`'s).
"""

from __future__ import annotations

import hashlib
import hmac


class Secret:
    """A resolved secret. repr() and str() are redacted; `reveal()` is the only way to the value."""

    __slots__ = ("_digest", "_value", "reference")

    def __init__(self, value: str, reference: str) -> None:
        self._value = value
        self.reference = reference  # e.g. ${env:FLEETLLM_FLEET_KEY}: safe to show
        self._digest: bytes | None = None

    def reveal(self) -> str:
        return self._value

    def digest(self) -> bytes:
        """The SHA-256 of the value (what `matches` compares), computed once."""
        if self._digest is None:
            self._digest = _digest(self.reveal())
        return self._digest

    def __repr__(self) -> str:
        return f"Secret({self.reference})"

    __str__ = __repr__


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
    """Whether `given` is the secret: compared in constant time (of digests, so not even the length shows)."""
    return given is not None and hmac.compare_digest(_digest(given), expected.digest())


METRICS_CHALLENGE = 'Bearer realm="fleetllm metrics"'  # WWW-Authenticate of a refused GET /metrics
LIVE_PATH = "/health/live"  # beside /metrics, public: the pods' liveness probe, which sends no token


def metrics_refusal(token: Secret | None, authorization: str | None) -> tuple[int, str] | None:
    """GET /metrics: None when it may be answered (no metrics_token configured: public; or the request
    carries it as Authorization: Bearer); else 401 (no bearer) or 403 (another one) and the sentence to
    answer with, which names the setting and never a token, and no metric."""
    if token is None:
        return None
    given = bearer_token(authorization)
    if given is None:
        return 401, ("GET /metrics needs the metrics token (metrics_token in the config): send Authorization: "
                     "Bearer <token>, e.g. Prometheus' authorization.credentials_file")
    if not matches(given, token):
        return 403, "wrong metrics token: send the one metrics_token in the config refers to"
    return None
