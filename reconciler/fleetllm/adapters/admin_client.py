"""The one client of the control plane's admin API (POST /admin/*, GET /admin/control, /admin/rollout) for
the CLI's operator commands (`fleetllm sync|suspend|resume|pin|unpin|control`, `fleetllm rollout`).

Where: `--url` or $FLEETLLM_URL (https://..., or http:// on a loopback address). Who: an admin token,
from `--token-file FILE` or $FLEETLLM_ADMIN_TOKEN (a command that only reads may take a viewer token,
$FLEETLLM_VIEWER_TOKEN), never from the command line (a process list shows it); it travels only in the
Authorization header, and no message quotes it. TLS is verified, against `--ca-file` when given (the
control plane's own CA).

Standard library HTTP through fleetllm.adapters.outgoing (the policy of every client that carries a secret:
no redirect followed, no proxy from the environment, an overall deadline, nothing secret in a message):
one short request per command, nothing to pool, no event loop.
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fleetllm.adapters.outgoing import OutgoingError, fetch, plain_http_problem
from fleetllm.core.secret import Secret
from fleetllm.errors import ConfigurationError, RequestError, UpstreamError

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
    problem = plain_http_problem(url)
    if problem is not None:
        raise ConfigurationError(f"--url {url!r}: {problem}")
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

    def with_timeout(self, timeout_s: float) -> AdminClient:
        return replace(self, timeout_s=timeout_s)

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
        where = f"{method} {self.url}{path}"
        try:
            answer = fetch(method, self.url + path, what=f"{where}: cannot reach the control plane", headers=headers,
                           data=data, timeout_s=self.timeout_s, context=self._context(),
                           max_bytes=MAX_ANSWER_BYTES)  # the Authorization value is scrubbed from any error
        except OutgoingError as exc:
            raise AdminApiError(str(exc)) from None
        if 200 <= answer.status < 300:
            return _decode(answer.body, where)
        decoded = _decode(answer.body, where, strict=False)
        message = decoded.get("error") if isinstance(decoded, dict) else None
        text = str(message)[:300] if message else f"HTTP {answer.status}"
        if 300 <= answer.status < 400:
            raise AdminApiError(f"{where}: HTTP {answer.status}: a redirect, not followed (the token goes only to "
                                "--url); give the control plane's final URL")
        if 400 <= answer.status < 500:  # it was reached: the path is enough
            raise AdminRefused(f"{method} {path}: HTTP {answer.status}: {text}", answer.status)
        raise AdminApiError(f"{where}: HTTP {answer.status}: {text}")


def _decode(raw: bytes, where: str, *, strict: bool = True) -> Any:
    try:
        return json.loads(raw or b"null")
    except ValueError:
        if strict:
            raise AdminApiError(f"{where}: the answer is not JSON") from None
        return None
