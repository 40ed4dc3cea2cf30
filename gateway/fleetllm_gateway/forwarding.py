"""LLMhop's routing and forwarding rules as pure functions (llmhop.md §2-§4).

Bearer check, model selection from a JSON body, `/route/{model}/` parsing, and the header rewrites
in both directions. Header lists are `(name, value)` pairs in arrival order, duplicates kept.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from fleetllm_gateway import jsonscan

# Never forwarded in either direction (Go's httputil.ReverseProxy list), plus what the header
# `Connection` names. Content-Length and Expect are recomputed by the gateway for its own framing.
HOP_BY_HOP = frozenset({"connection", "proxy-connection", "keep-alive", "proxy-authenticate",
                        "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade"})
_REQUEST_DROP = HOP_BY_HOP | {"content-length", "expect", "host", "forwarded", "x-forwarded-for",
                              "x-forwarded-host", "x-forwarded-proto"}
_RESPONSE_DROP = HOP_BY_HOP | {"content-length"}
# The gateway frames the upstream request itself; Go's transport likewise ignores these in a header map.
_NOT_INJECTABLE = frozenset({"content-length", "transfer-encoding", "trailer"})


def bearer_ok(authorization: str | None, tokens: Sequence[bytes]) -> bool:
    """`Bearer <token>`: scheme case-insensitive, split at the first space, token compared exactly
    and in constant time against every configured token. Whitespace around the field value is not
    part of it (RFC 9110 §5.5), so strip it here."""
    if authorization is None:
        return False
    scheme, space, presented = authorization.strip(" \t").partition(" ")
    if not space or scheme.lower() != "bearer":
        return False
    candidate = presented.encode("utf-8", "surrogateescape")
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(candidate, token)
    return matched


def select_model(body: bytes) -> str:
    """The top-level `model` of a JSON body (last duplicate wins, nested ones ignored), or BodyError.
    Synchronous; the gateway itself uses fleetllm_gateway.jsonscan.find_model, which lets the loop run."""
    return jsonscan.select_model(body)


@dataclass(frozen=True)
class PathRoute:
    model: str  # percent-decoded
    rest: str  # the remainder with its escaping kept, starting with "/"


@dataclass(frozen=True)
class Redirect:
    location: str


def parse_route(raw_path: str, raw_query: str) -> PathRoute | Redirect | None:
    """`/route/{model}/{rest}` -> PathRoute; `/route/{model}` -> 307 to the slashed form; else None."""
    if not raw_path.startswith("/route/"):
        return None
    segment, slash, rest = raw_path[len("/route/"):].partition("/")
    if not segment:
        return None
    if not slash:
        return Redirect(f"{raw_path}/?{raw_query}" if raw_query else f"{raw_path}/")
    return PathRoute(unquote(segment), "/" + rest)


def models_api_name(raw_path: str) -> str | None:
    """The decoded `{model}` of `/v1/models/{model}` (one non-empty segment), else None."""
    if not raw_path.startswith("/v1/models/"):
        return None
    segment = raw_path[len("/v1/models/"):]
    if not segment or "/" in segment:
        return None
    return unquote(segment)


_NOTHING_NAMED: frozenset[str] = frozenset()


def _connection_tokens(headers: Iterable[tuple[str, str]]) -> frozenset[str] | set[str]:
    named: set[str] | None = None
    for name, value in headers:
        if name.lower() == "connection":
            if named is None:
                named = set()
            named.update(token.strip().lower() for token in value.split(","))
    return _NOTHING_NAMED if named is None else named


def upstream_headers(client: Sequence[tuple[str, str]], *, client_ip: str, client_host: str | None,
                     strip_authorization: bool, injected: Sequence[tuple[str, str]],
                     default_host: str) -> tuple[str, list[tuple[str, str]]]:
    """The Host and the other headers of the upstream request.

    Hop-by-hop and forwarding headers are dropped (`Te: trailers` survives), the client's bearer is
    dropped when the gateway checked it, `X-Forwarded-For/-Host/-Proto` are set, and the model's
    configured headers replace same-named ones last (a configured `Host` becomes the Host).
    """
    named = _connection_tokens(client)
    keep_te = False
    out: list[tuple[str, str]] = []
    for name, value in client:
        lower = name.lower()
        if lower == "te":
            keep_te = keep_te or "trailers" in (t.strip().lower() for t in value.split(","))
        if lower in _REQUEST_DROP or lower in named or (strip_authorization and lower == "authorization"):
            continue
        out.append((name, value))
    if keep_te:
        out.append(("Te", "trailers"))
    host = client_host or default_host
    out.append(("X-Forwarded-For", client_ip))
    if client_host:
        out.append(("X-Forwarded-Host", client_host))
    out.append(("X-Forwarded-Proto", "http"))
    if injected:
        replaced = {name.lower() for name, _ in injected}
        out = [(name, value) for name, value in out if name.lower() not in replaced]
        for name, value in injected:
            if name.lower() in _NOT_INJECTABLE:
                continue
            if name.lower() == "host":
                host = value
            else:
                out.append((name, value))
    return host, out


def client_headers(upstream: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Upstream response headers minus hop-by-hop ones and the framing the gateway redoes."""
    named = _connection_tokens(upstream)
    return [(name, value) for name, value in upstream
            if (lower := name.lower()) not in _RESPONSE_DROP and lower not in named]
