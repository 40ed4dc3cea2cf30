"""Which forward proxy, if any, a TCP upstream is reached through: `HTTP_PROXY`, `HTTPS_PROXY` and
`NO_PROXY` (or their lower-case forms), read once at start-up as Go's http.ProxyFromEnvironment does.

As in Go: `localhost` and loopback addresses are never proxied, a proxy written without a scheme is
`http://`, and `NO_PROXY` lists hosts or domain suffixes (`*` for all). Only `http://` proxies are
supported (Go also speaks https and socks5 to a proxy); unix-socket upstreams never use one.
"""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from fleetllm_contract.addresses import is_loopback
from fleetllm_gateway.errors import GatewayError
from fleetllm_gateway.target import Target


class ProxyError(GatewayError, ValueError):
    """A proxy variable the gateway cannot use; the message never includes the proxy's credentials."""


@dataclass(frozen=True)
class Proxy:
    host: str
    port: int
    authorization: str | None = field(default=None, repr=False)  # a Proxy-Authorization value

    @property
    def header(self) -> str:
        return f"Proxy-Authorization: {self.authorization}\r\n" if self.authorization else ""


def bypassed(host: str, port: int, no_proxy: str) -> bool:
    """Whether NO_PROXY names the host: `*`, a CIDR range, an IP, or a domain (`example.com`,
    `.example.com` and `*.example.com` all match it and its subdomains), each optionally `:port`."""
    host = host.lower()
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if entry == "*":
            return True
        if "/" in entry:
            try:
                if ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        name, entry_port = entry, ""
        if entry.startswith("["):
            name, _, rest = entry[1:].partition("]")
            entry_port = rest.removeprefix(":")
        elif entry.count(":") == 1:
            name, entry_port = entry.split(":")
        if not name or (entry_port and entry_port != str(port)):
            continue
        domain = name.lstrip("*").lstrip(".")
        if host == domain or host.endswith("." + domain):
            return True
    return False


def _variable(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name.upper()) or environ.get(name.lower()) or ""


def proxy_for(target: Target, environ: Mapping[str, str]) -> Proxy | None:
    if target.is_unix or is_loopback(target.host):
        return None
    variable = "HTTPS_PROXY" if target.scheme == "https" else "HTTP_PROXY"
    value = _variable(environ, variable)
    if not value:
        return None
    no_proxy = _variable(environ, "NO_PROXY")
    if bypassed(target.host, target.port, no_proxy):
        return None
    parts = urlsplit(value if "://" in value else f"http://{value}")
    if parts.scheme != "http" or not parts.hostname:
        raise ProxyError(f"{variable}: only http://host:port proxies are supported")
    try:
        port = parts.port or 80
    except ValueError:
        raise ProxyError(f"{variable}: invalid port") from None
    authorization = None
    if parts.username is not None:
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(credentials.encode()).decode()
    return Proxy(parts.hostname, port, authorization)
