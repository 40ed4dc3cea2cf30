"""The one outgoing-HTTP policy of every reconciler-side client that carries a secret (the admin and rollout
CLI's admin client, `import llmao --check`, the metrics push; the notifier and the forge use aiohttp through
fleetllm.adapters.http.request_json with the same rules):

- **TLS or loopback only**: `https://`, or `http://` to a loopback address (`plain_http_problem`);
- **no redirect followed**: a 3xx is an answer, so a credential goes only where the URL says;
- **no proxy unless asked**: `http_proxy`/`https_proxy` in the environment are ignored; a caller passes
  `proxy=` explicitly to use one;
- **an overall deadline per request**: connect, headers and body together, however slowly a server drips
  (a timer shuts the socket down at the deadline; urllib's own timeout is per read);
- **no secret in an error**: every message is scrubbed of the secrets given, their base64 forms (basic
  auth) and every Authorization value sent, and it never quotes a reason phrase (a server may echo the
  request there).

Standard library only (urllib), one short request at a time.
"""

from __future__ import annotations

import base64
import http.client
import ipaddress
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from fleetllm.errors import UpstreamError
from fleetllm_contract.addresses import is_loopback
from fleetllm_contract.deadline import Watchdog, watched

__all__ = ["Answer", "OutgoingError", "fetch", "hidden_forms", "link_local_problem", "plain_http_problem", "scrub"]

MAX_ANSWER_BYTES = 4 * 1024 * 1024


def scrub(text: str, secrets: Iterable[str]) -> str:
    """Error bodies may echo what we sent (a 422 repeats its input): never let a secret through. The
    longest first, so that a secret containing another is replaced whole."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "<redacted>")
    return text


class OutgoingError(UpstreamError):
    """The request could not be made or got no whole answer in time (never a secret in the message)."""


def plain_http_problem(url: str) -> str | None:
    """Why a secret may not go to `url` (not http(s), no host, plain http to a non-loopback host), or None."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "give an https:// URL (http:// only to a loopback address)"
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        return (f"plain http to {parts.hostname} would send the credential in clear; use https:// (http:// only "
                "to a loopback address)")
    return None


def link_local_problem(host: str) -> str | None:
    """Why a receiver may not be at `host`: a link-local address (169.254.0.0/16, fe80::/10) is a cloud's
    metadata service (169.254.169.254 hands out instance credentials) or another machine's neighbour, never
    a receiver of fleetllm's. None for any other host (names are not resolved here)."""
    try:
        address = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_link_local:
        return (f"{host} is a link-local address (a cloud's metadata service lives there, e.g. 169.254.169.254): "
                "give the receiver's own address or name")
    return None


def hidden_forms(secrets: Iterable[str]) -> tuple[str, ...]:
    """Each secret as sent: itself, its base64 (basic auth), and the value of an Authorization header."""
    found: list[str] = []
    for secret in secrets:
        if not secret:
            continue
        found += [secret, base64.b64encode(secret.encode()).decode()]
        if " " in secret:
            found.append(secret.split(" ", 1)[1])
    return tuple(found)


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises the 3xx as an HTTPError: an answer, not followed


def _opener(deadline: Watchdog, context: ssl.SSLContext | None, proxy: str | None) -> urllib.request.OpenerDirector:
    class Http(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(watched(http.client.HTTPConnection, deadline), req)

    class Https(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(watched(http.client.HTTPSConnection, deadline), req, context=context)

    proxies = {"http": proxy, "https": proxy} if proxy else {}
    return urllib.request.build_opener(urllib.request.ProxyHandler(proxies), _NoRedirect(), Http(), Https())


def fetch(method: str, url: str, *, what: str, headers: Mapping[str, str] | None = None, data: bytes | None = None,
          timeout_s: float = 30.0, ca_file: str | None = None, context: ssl.SSLContext | None = None,
          proxy: str | None = None, secrets: Iterable[str] = (), max_bytes: int = MAX_ANSWER_BYTES) -> Answer:
    """One request under the policy above. Any answer (3xx and errors included) is an Answer with its body
    scrubbed of the secrets unless 2xx; OutgoingError when there is none in `timeout_s`, the URL breaks the
    policy, or the transport fails. `what` names the request in messages (never a secret)."""
    problem = plain_http_problem(url)
    if problem is not None:
        raise OutgoingError(f"{what}: {problem}")
    sent = dict(headers or {})
    hidden = hidden_forms([*secrets, *(v for k, v in sent.items() if k.lower() in ("authorization", "x-api-key"))])
    if context is None and url.startswith("https://"):
        try:
            context = ssl.create_default_context(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise OutgoingError(f"{what}: CA file {ca_file}: {exc}") from None
    request = urllib.request.Request(url, data=data, method=method, headers=sent)  # noqa: S310 (checked above)
    started = time.monotonic()
    deadline = Watchdog(timeout_s)
    try:
        opener = _opener(deadline, context, proxy)
        with opener.open(request, timeout=timeout_s) as response:
            answer = Answer(response.status, _read(response, max_bytes), dict(response.headers.items()))
        if deadline.expired:  # a body cut by the deadline may look whole (no length, connection closed)
            raise OSError("deadline")
        return answer
    except urllib.error.HTTPError as exc:
        try:
            body = _read(exc, max_bytes)
        except OSError:
            body = b""
        clean = scrub(body.decode("utf-8", "replace"), hidden).encode()
        return Answer(exc.code, clean, {k: scrub(v, hidden) for k, v in exc.headers.items()})
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        if deadline.expired or time.monotonic() - started >= timeout_s:
            raise OutgoingError(f"{what}: timed out: no whole answer within {timeout_s:g} s") from None
        reason = getattr(exc, "reason", exc)
        raise OutgoingError(scrub(f"{what}: {type(exc).__name__}: {reason}", hidden)[:300]) from None
    finally:
        deadline.close()


def _read(response: Any, max_bytes: int) -> bytes:
    return bytes(response.read(max_bytes))
