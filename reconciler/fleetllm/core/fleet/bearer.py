"""Per-server vLLM bearers, derived and never stored (the box contract's derivation).

    HMAC-SHA256(salt, "llmao.vllm.api_key\\n" + host + "\\n" + listen_port)
    -> "sk-vllm-" + urlsafe base64 without padding

The host is the box's name (an IPv4-mapped IPv6 address is reduced to its IPv4 form) and the port
is the listen port in decimal. The salt never leaves the control plane: nothing here logs, prints
or returns it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from pathlib import Path

from fleetllm.errors import ConfigurationError
from fleetllm_contract.addresses import normalise_host

DOMAIN = "llmao.vllm.api_key"
PREFIX = "sk-vllm-"
MIN_SALT_LENGTH = 16
SHORT_SALT_WARNING = (
    f"the bearer salt is shorter than {MIN_SALT_LENGTH} characters: it still works (every bearer stays as it "
    "is), but a longer salt is harder to guess; move to one box by box (docs/runbooks.md, \"Rotate the salt\")")


class SaltError(ConfigurationError, ValueError):
    """The salt is missing or unusable. Messages never contain the salt itself."""


class Salt:
    """The bearer salt, kept out of repr(), str() and tracebacks' locals rendering."""

    __slots__ = ("_key",)

    def __init__(self, value: str) -> None:
        if not value:
            raise SaltError("the bearer salt is empty")
        if value != value.strip():
            raise SaltError("the bearer salt has leading or trailing whitespace; remove it "
                            "(a salt file may end in one newline)")
        if value.upper().startswith("CHANGE_ME"):
            raise SaltError("the bearer salt is still a CHANGE_ME placeholder")
        # A short salt is accepted: it may already protect a running fleet (llmao accepts any length), and a
        # new salt means a new bearer and a vLLM restart on every box. `short` says so; callers warn.
        self._key = value.encode("utf-8")

    @property
    def short(self) -> bool:
        """True for a salt shorter than MIN_SALT_LENGTH characters: it works, with a warning."""
        return len(self._key.decode("utf-8")) < MIN_SALT_LENGTH

    def warning(self) -> str | None:
        """The short-salt warning (never the salt, nor its length), or None."""
        return SHORT_SALT_WARNING if self.short else None

    def __repr__(self) -> str:
        return "Salt(<redacted>)"

    __str__ = __repr__

    def derive(self, host: str, port: int) -> str:
        return derive_bearer(self, host, port)

    def report_key(self, host: str) -> str:
        return derive_report_key(self, host)

    def fingerprint(self) -> str:
        """A short, non-reversible id of the salt, to tell two salts apart in logs and state."""
        return hashlib.sha256(b"fleetllm.salt.fingerprint\n" + self._key).hexdigest()[:12]


def derive_bearer(salt: Salt, host: str, port: int) -> str:
    host = normalise_host(host)
    if not host:
        raise ValueError("cannot derive a bearer for an empty host")
    if isinstance(port, bool) or not isinstance(port, int) or port <= 0:
        raise ValueError(f"cannot derive a bearer for port {port!r}: need a positive integer")
    message = f"{DOMAIN}\n{host}\n{port}".encode()
    digest = hmac.new(salt._key, message, hashlib.sha256).digest()
    return PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


REPORT_KEY_DOMAIN = "fleetllm.box.report_key"
REPORT_KEY_PREFIX = "rk-"


def derive_report_key(salt: Salt, host: str) -> str:
    """A box's report key: what POST /vllm/report must carry (X-Fleetllm-Report-Key) besides the fleet key,
    so a leaked fleet key cannot report for another box. Derived like a bearer, in its own domain, from
    the box name alone; delivered in the box's JSON (`report_key`)."""
    host = normalise_host(host)
    if not host:
        raise ValueError("cannot derive a report key for an empty host")
    digest = hmac.new(salt._key, f"{REPORT_KEY_DOMAIN}\n{host}".encode(), hashlib.sha256).digest()
    return REPORT_KEY_PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def bearer_fingerprint(bearer: str) -> str:
    """What fleetllm stores and compares instead of a bearer (LiteLLM never returns api_key)."""
    return "sha256:" + hashlib.sha256(bearer.encode("utf-8")).hexdigest()[:16]


def read_secret_file(path: str | Path) -> str:
    """A secret file's contents with exactly one trailing newline (\\n or \\r\\n) removed."""
    text = Path(path).read_text(encoding="utf-8")
    if text.endswith("\r\n"):
        return text[:-2]
    if text.endswith("\n"):
        return text[:-1]
    return text


SALT_ENV = "FLEETLLM_VLLM_API_SALT"
LEGACY_KEY_ENV = "FLEETLLM_LEGACY_API_KEY"


def load_salt(salt_file: str | None, env: dict[str, str] | None = None) -> Salt:
    """The salt from `--salt-file`, else from $FLEETLLM_VLLM_API_SALT."""
    environ = os.environ if env is None else env
    if salt_file:
        try:
            return Salt(read_secret_file(salt_file))
        except OSError as exc:
            raise SaltError(f"cannot read the salt file {salt_file}: {exc.strerror}") from None
    value = environ.get(SALT_ENV)
    if value is None:
        raise SaltError(f"no bearer salt: pass --salt-file FILE or set {SALT_ENV}")
    return Salt(value)


def load_legacy_key(key_file: str | None, env: dict[str, str] | None = None) -> str | None:
    """The shared legacy bearer from `--legacy-key-file`, else $FLEETLLM_LEGACY_API_KEY, else None."""
    environ = os.environ if env is None else env
    if key_file:
        try:
            value = read_secret_file(key_file)
        except OSError as exc:
            raise SaltError(f"cannot read the legacy key file {key_file}: {exc.strerror}") from None
    else:
        value = environ.get(LEGACY_KEY_ENV, "")
    if value and value != value.strip():
        raise SaltError("the legacy shared key has leading or trailing whitespace; remove it")
    return value or None
