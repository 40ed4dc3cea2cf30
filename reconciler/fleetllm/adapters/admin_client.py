"""The one client of the control plane's admin API (POST /admin/*, GET /admin/control, /admin/rollout) for
the CLI's operator commands (`fleetllm sync|suspend|resume|pin|unpin|control`, `fleetllm rollout`).

Where: `--url` or $FLEETLLM_URL (https://..., or http:// on a loopback address). Who: an admin token,
from `--token-file FILE` or $FLEETLLM_ADMIN_TOKEN (a command that only reads may take a viewer token,
$FLEETLLM_VIEWER_TOKEN), never from the command line (a process list shows it); it travels only in the
Authorization header, and no message quotes it. TLS is verified, against `--ca-file` when given (the
control plane's own CA).

Standard library HTTP (urllib): one short request per command, nothing to pool, no event loop.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fleetllm.core.secret import Secret
from fleetllm.errors import ConfigurationError, RequestError, UpstreamError
from fleetllm_contract.addresses import is_loopback

URL_ENV = "FLEETLLM_URL"
TOKEN_ENV = "FLEETLLM_ADMIN_TOKEN"  # noqa: S105 (the variable's name)
VIEWER_TOKEN_ENV = "FLEETLLM_VIEWER_TOKEN"  # noqa: S105 (the variable's name)
TIMEOUT_S = 30.0
MAX_ANSWER_BYTES = 4 * 1024 * 1024


class AdminApiError(UpstreamError):
    """The control plane could not be reached, or answered with a server error."""


class AdminRefused(RequestError):  # noqa: N818 (what happened to the request)
    """The control plane refused the request (4xx): the message is its answer."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def control_plane_url(given: str | None, env: dict[str, str]) -> str:
    url = (given or env.get(URL_ENV) or "").strip().rstrip("/")
    if not url:
        raise ConfigurationError(f"no control plane: give --url https://HOST:PORT or set {URL_ENV}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(f"--url {url!r}: give https://HOST:PORT (http:// only on a loopback address)")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ConfigurationError(f"--url {url}: plain http would send the admin token in clear; use https:// "
                                 "(http:// only on a loopback address)")
    return url


def admin_token(token_file: str | None, env: dict[str, str], names: tuple[str, ...] = (TOKEN_ENV,)) -> Secret:
    """The token from `token_file`, else the first of the variables `names` that is set."""
    if token_file:
        try:
            text = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigurationError(f"--token-file {token_file}: {exc.strerror}") from None
        if not text:
            raise ConfigurationError(f"--token-file {token_file} is empty")
        return Secret(text, f"--token-file {token_file}")
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return Secret(value, f"${name}")
    what = "admin token" if names == (TOKEN_ENV,) else "token"
    raise ConfigurationError(f"no {what}: give --token-file FILE or set {' or '.join(names)} (never the token "
                             "itself on the command line)")


@dataclass(frozen=True)
class AdminClient:
    url: str  # the control plane's base URL
    token: Secret
    ca_file: str | None = None
    timeout_s: float = TIMEOUT_S

    def _context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https://"):
            return None
        try:
            return ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(f"--ca-file {self.ca_file}: {exc}") from None

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The decoded JSON answer of a 2xx; AdminRefused for a 4xx (its message), AdminApiError otherwise."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token.reveal()}", "Accept": "application/json",
                   "User-Agent": "fleetllm-cli"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.url + path, data=data, method=method,  # noqa: S310 (http(s) only:
                                         headers=headers)  # control_plane_url checked the scheme)
        where = f"{method} {self.url}{path}"
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s,  # noqa: S310 (as above)
                                        context=self._context()) as response:
                return _decode(response.read(MAX_ANSWER_BYTES), where)
        except urllib.error.HTTPError as exc:
            answer = _decode(exc.read(MAX_ANSWER_BYTES), where, strict=False)
            message = answer.get("error") if isinstance(answer, dict) else None
            text = str(message) if message else f"HTTP {exc.code}"
            if 400 <= exc.code < 500:  # it was reached: the path is enough
                raise AdminRefused(f"{method} {path}: HTTP {exc.code}: {text}", exc.code) from None
            raise AdminApiError(f"{where}: HTTP {exc.code}: {text}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AdminApiError(f"{where}: cannot reach the control plane: {reason}") from None


def _decode(raw: bytes, where: str, *, strict: bool = True) -> Any:
    try:
        return json.loads(raw or b"null")
    except ValueError:
        if strict:
            raise AdminApiError(f"{where}: the answer is not JSON") from None
        return None
