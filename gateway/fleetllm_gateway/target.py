"""Where a model's requests go: an http(s) base URL or a unix socket, and how a request path joins it.

Pure: parsing a model `url` and building the upstream request target. Paths and queries stay in their
raw (escaped) form from end to end, so `%2F` in a request reaches the upstream as `%2F`.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from fleetllm_gateway.errors import GatewayError

_DEFAULT_PORTS = {"http": 80, "https": 443}


class TargetError(GatewayError, ValueError):
    """A model url that is not an absolute http(s) URL or unix:///<absolute socket path>."""


@dataclass(frozen=True)
class Target:
    scheme: str  # "http", "https" or "unix"
    host: str = ""  # TCP host, IPv6 without brackets; "" for a socket
    port: int = 0
    base_path: str = ""  # raw (escaped) path of the url; "" for a socket
    base_query: str = ""  # raw query of the url; "" for a socket
    socket_path: str = ""

    @property
    def is_unix(self) -> bool:
        return self.scheme == "unix"

    @property
    def authority(self) -> str:
        """`host[:port]` as a Host header names it (default port omitted, IPv6 bracketed)."""
        if self.is_unix:
            return "localhost"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == _DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"

    @property
    def authority_with_port(self) -> str:
        """`host:port` with the port always written (a CONNECT request's target)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def request_target(self, raw_path: str, raw_query: str) -> str:
        """Base path joined with the request's path (one slash between), then base query `&` request query."""
        path = _join_path(self.base_path, raw_path) or "/"
        query = f"{self.base_query}&{raw_query}" if self.base_query and raw_query else self.base_query or raw_query
        return f"{path}?{query}" if query else path


def _join_path(base: str, path: str) -> str:
    if not base:
        return path
    if base.endswith("/") and path.startswith("/"):
        return base + path[1:]
    if not base.endswith("/") and not path.startswith("/"):
        return f"{base}/{path}"
    return base + path


def _shown(url: str) -> str:
    """The url for an error message, any `user:password@` masked."""
    return re.sub(r"//[^/?#@]*@", "//***@", url)


def parse_target(url: str) -> Target:
    """Parse a model url as LLMhop does; the TargetError message is LLMhop's (`url "x" must be ...`)."""
    if any(ch <= " " or ch == "\x7f" for ch in url):
        # urlsplit would silently drop tabs and newlines; Go's url.Parse rejects control characters.
        raise TargetError(f'url "{_shown(url)}" must be an absolute http(s) or unix URL')
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise TargetError(f'url "{_shown(url)}" must be an absolute http(s) or unix URL') from None
    if parts.scheme in _DEFAULT_PORTS:
        if parts.username is not None or parts.password is not None or parts.fragment:
            raise TargetError("http(s) backend URL must not contain credentials or a fragment")
        if parts.hostname:
            return Target(parts.scheme, parts.hostname, port or _DEFAULT_PORTS[parts.scheme],
                          parts.path, parts.query)
    elif parts.scheme == "unix":
        if parts.netloc or not posixpath.isabs(parts.path) or parts.query or parts.fragment or "?" in url:
            raise TargetError(f'url "{_shown(url)}" must be unix:///<absolute socket path>')
        return Target("unix", socket_path=unquote(parts.path))
    raise TargetError(f'url "{_shown(url)}" must be an absolute http(s) or unix URL')
