"""`Secret`: a resolved secret (a key, a token, a password) that does not show itself.

The settings (fleetllm.settings) resolve every `${env:}`/`${file:}`/`${cred:}` reference into one, and
it travels as a `Secret` to the constructor of the client that puts it on the wire (the LiteLLM client,
a provider client, the state store's connection): `reveal()` is called there and nowhere above.
"""

from __future__ import annotations


class Secret:
    """A resolved secret. repr() and str() are redacted; `reveal()` is the only way to the value."""

    __slots__ = ("_value", "reference")

    def __init__(self, value: str, reference: str) -> None:
        self._value = value
        self.reference = reference  # e.g. ${env:FLEETLLM_FLEET_KEY}: safe to show

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({self.reference})"

    __str__ = __repr__
