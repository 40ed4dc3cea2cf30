"""Talking to the control plane: GET /vllm/config, POST /vllm/report and GET /vllm/gateway-native/<tag>.

TLS certificates are always verified (a CA bundle may be added; there is no switch to turn checking
off). Plain http:// is refused except to a loopback address, since the fleet key travels in the
request. Redirects are not followed: they would carry the fleet key to another address.

Retries: connection errors, timeouts, 429 and 5xx are retried with capped exponential backoff and
full jitter (delay = uniform(0, min(CAP_S, BASE_S * 2**attempt)), a 429's Retry-After respected)
until the deadline. 401/403 (wrong fleet key) and 404 (this box is not in the placement) fail at
once with a message that says what to fix.

Proxies: https:// goes through https_proxy (respecting no_proxy) in a CONNECT tunnel; plain http://
never uses a proxy (proxies_for), so the fleet key is never sent in clear to one.

Deadline: each request as a whole (connect, TLS handshake, proxy tunnel, sending, the status line,
headers and body) ends within REQUEST_TIMEOUT_S, however slowly the server drips its answer: a
watchdog shuts the request's sockets down at the deadline (a socket timeout alone bounds each read,
and a byte every 5 s held a poll for a minute, issue 27). A body shorter than its Content-Length (a
connection cut mid-answer) is an error, never an answer.

No secret in a message: text the server controls (a reason phrase, a redirect's Location, a broken
status line) is shown with the fleet key blanked out, as printable ASCII, cut short (_Scrub).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import random
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetllm_contract.addresses import is_loopback
from fleetllm_contract.deadline import Watchdog, watched
from fleetllm_contract.gatewaynative import MAX_ARCHIVE_BYTES, PATH_PREFIX
from fleetllm_installer.errors import InstallerError

BASE_S = 1.0
CAP_S = 60.0
REQUEST_TIMEOUT_S = 30.0
MAX_BODY = 8 * 1024 * 1024
USER_AGENT = "fleetllm-installer"


class FetchError(InstallerError, RuntimeError):
    """The control plane could not be used; the message says why and what to do."""

    retryable = True


class NotFoundError(FetchError):
    """404: the control plane has no such thing (for /vllm/config: it does not know this box)."""


@dataclass(frozen=True)
class ConfigAnswer:
    status: int
    body: bytes = field(repr=False)
    etag: str | None = None


def _etag(value: str | None) -> str | None:
    """An ETag worth sending back: short printable ASCII (a control plane may answer anything)."""
    if value is None or not re.fullmatch(r"[\x21-\x7e]{1,256}", value.strip()):
        return None
    return value.strip()


class _RetryableError(Exception):
    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


MAX_SHOWN = 200  # characters of server-controlled text quoted in a message


@dataclass(frozen=True)
class _Scrub:
    """Server-controlled text made fit for a message: the fleet key blanked out wherever a server echoes it,
    control and non-ASCII characters replaced, cut to MAX_SHOWN."""

    secret: str = field(repr=False)

    def __call__(self, text: object) -> str:
        shown = str(text).replace(self.secret, "[fleet key]") if self.secret else str(text)
        shown = "".join(ch if " " <= ch <= "~" else "?" for ch in shown)
        return shown if len(shown) <= MAX_SHOWN else shown[:MAX_SHOWN - 3] + "..."


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def __init__(self, scrub: _Scrub) -> None:
        super().__init__()
        self.scrub = scrub

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        raise FetchError(f"the control plane redirected ({code}) to {self.scrub(newurl)}: set the control plane "
                         "URL to the final address (redirects are not followed, they would carry the fleet key "
                         "elsewhere)")


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, watchdog: Watchdog) -> None:
        super().__init__()
        self.watchdog = watchdog

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(watched(http.client.HTTPConnection, self.watchdog), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, context: ssl.SSLContext, watchdog: Watchdog) -> None:
        super().__init__(context=context)
        self.context = context
        self.watchdog = watchdog

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(watched(http.client.HTTPSConnection, self.watchdog), req, context=self.context)


def check_url(url: str) -> None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and parts.hostname and is_loopback(parts.hostname):
        return
    if parts.scheme == "http":
        raise FetchError(f"control plane URL {url} is plain http: use https (http is allowed only to loopback)")
    raise FetchError(f"control plane URL {url!r} is not an https:// URL")


def proxies_for(base_url: str) -> dict[str, str]:
    """The proxies the client may use. Plain http:// (allowed to loopback only) never goes through a proxy:
    urllib would hand the proxy the whole request, the fleet key in clear (issue 16, finding 12), and
    a loopback address is not reached through one anyway. https:// uses https_proxy from the environment,
    minus the hosts of no_proxy (urllib's own rules), through a CONNECT tunnel: the proxy sees the host
    and port, never the request or its headers. Only the https entry is kept, so nothing else is used."""
    if urllib.parse.urlsplit(base_url).scheme != "https":
        return {}
    https = urllib.request.getproxies().get("https")
    return {"https": https} if https else {}


@dataclass
class Client:
    base_url: str
    fleet_key: str
    host: str
    ca_bundle: Path | None = None
    deadline_s: float = 600.0
    user_agent: str = USER_AGENT
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    jitter: Callable[[float, float], float] = random.uniform
    log: Callable[[str], None] = field(default=lambda message: None)

    def __repr__(self) -> str:
        return f"Client(base_url={self.base_url!r}, host={self.host!r})"

    def _opener(self, watchdog: Watchdog) -> urllib.request.OpenerDirector:
        context = ssl.create_default_context()
        if self.ca_bundle is not None:
            context.load_verify_locations(cafile=str(self.ca_bundle))
        return urllib.request.build_opener(_HTTPHandler(watchdog), _HTTPSHandler(context, watchdog),
                                           _NoRedirect(_Scrub(self.fleet_key)),
                                           urllib.request.ProxyHandler(proxies_for(self.base_url)))

    def _request(self, method: str, path: str, body: bytes | None,
                 headers: Mapping[str, str] | None = None) -> bytes:
        return self._exchange(method, path, body, headers).body

    def _exchange(self, method: str, path: str, body: bytes | None,
                  headers: Mapping[str, str] | None = None) -> ConfigAnswer:
        """One request: the status (2xx, or 304 to a conditional GET), the body and the ETag."""
        url = self.base_url + path
        request = urllib.request.Request(url, data=body, method=method)  # noqa: S310 - check_url: https or loopback
        request.add_unredirected_header("Authorization", f"Bearer {self.fleet_key}")
        request.add_header("X-LLMAO-Host", self.host)
        request.add_header("Accept", "application/json")
        request.add_header("User-Agent", self.user_agent)
        if body is not None:
            request.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        watchdog = Watchdog(REQUEST_TIMEOUT_S)
        scrub = _Scrub(self.fleet_key)
        try:
            with self._opener(watchdog).open(request, timeout=REQUEST_TIMEOUT_S) as response:
                data = bytes(response.read(MAX_BODY + 1))
                short = len(data) <= MAX_BODY and response.length  # fewer bytes than its Content-Length said
                if watchdog.expired and (short or response.length is None):  # (an answer ended by a close)
                    raise http.client.IncompleteRead(data)
                if short:
                    raise _RetryableError(f"{path}: the answer was cut off after {len(data)} bytes, "
                                          f"{response.length} short of its Content-Length")
                return ConfigAnswer(int(response.status), data, _etag(response.headers.get("ETag")))
        except urllib.error.HTTPError as exc:
            if exc.code == 304 and headers and "If-None-Match" in headers:
                return ConfigAnswer(304, b"", _etag(exc.headers.get("ETag") if exc.headers else None))
            raise self._status_error(exc, path) from None
        except (urllib.error.URLError, OSError, TimeoutError, http.client.HTTPException) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise FetchError(f"TLS certificate of {self.base_url} not trusted: {reason.verify_message}; "
                                 "name a CA bundle in FLEETLLM_CA_BUNDLE if the control plane uses a private CA"
                                 ) from None
            if watchdog.expired:
                raise _RetryableError(f"{url}: no complete answer within {REQUEST_TIMEOUT_S:g} s (the deadline "
                                      "of one request)") from None
            raise _RetryableError(f"cannot reach {url}: {scrub(reason)}") from None
        finally:
            watchdog.close()

    def _status_error(self, exc: urllib.error.HTTPError, path: str) -> Exception:
        status = exc.code
        if status in (401, 403):
            return FetchError(f"{path}: the control plane refused the fleet key ({status}): check "
                              "FLEETLLM_FLEET_KEY (or FLEET_KEY) in the box template")
        if status == 404:
            return NotFoundError(f"{path}: the control plane does not know the box {self.host!r} (404): add it "
                                 "to placement.yaml, or fix LLMAO_HOST if the provisioning script set the wrong name")
        if status == 429 or status >= 500:
            retry_after = exc.headers.get("Retry-After") if exc.headers else None
            # ASCII digits only: str.isdigit() takes "²", which float() refuses
            seconds = float(retry_after) if retry_after and re.fullmatch(r"[0-9]{1,9}", retry_after.strip()) else None
            return _RetryableError(f"{path}: the control plane answered {status}", seconds)
        return FetchError(f"{path}: the control plane answered {status} {_Scrub(self.fleet_key)(exc.reason)}")

    def call(self, method: str, path: str, body: bytes | None = None, deadline_s: float | None = None,
             headers: Mapping[str, str] | None = None) -> bytes:
        """One request with retries until the deadline. Raises FetchError."""
        deadline = self.clock() + (self.deadline_s if deadline_s is None else deadline_s)
        attempt = 0
        while True:
            try:
                data = self._request(method, path, body, headers)
            except _RetryableError as exc:
                delay = self.jitter(0.0, min(CAP_S, BASE_S * 2 ** attempt))
                if exc.retry_after is not None:
                    delay = max(delay, min(exc.retry_after, CAP_S))
                if self.clock() + delay > deadline:
                    raise FetchError(f"{exc} (gave up after {attempt + 1} attempts)") from None
                self.log(f"{exc}; retrying in {delay:.1f} s")
                self.sleep(delay)
                attempt += 1
                continue
            if len(data) > MAX_BODY:
                raise FetchError(f"{path}: the answer is larger than {MAX_BODY} bytes")
            return data

    def fetch_config(self) -> bytes:
        return self.call("GET", "/vllm/config")

    def poll_config(self, etag: str | None) -> ConfigAnswer:
        """One conditional GET /vllm/config (the box agent's poll): `If-None-Match: etag`, so an unchanged
        config is a 304 with no body. No retries: the agent's loop backs off. Raises FetchError."""
        try:
            answer = self._exchange("GET", "/vllm/config", None, {"If-None-Match": etag} if etag else None)
        except _RetryableError as exc:
            raise FetchError(str(exc)) from None
        if len(answer.body) > MAX_BODY:
            raise FetchError(f"/vllm/config: the answer is larger than {MAX_BODY} bytes")
        return answer

    def fetch_gateway_native(self, tag: str, etag: str | None) -> ConfigAnswer | None:
        """One conditional GET /vllm/gateway-native/<tag> (fleetllm_contract.gatewaynative): the archive of
        the compiled gateway for that tag (200), 304 when the box holds the one named by `etag`, None when
        the control plane has none (404). No retries: without it the gateway runs its Python modules.
        Raises FetchError, also for an answer whose sha256 is not its ETag (cut short, or not a build)."""
        path = PATH_PREFIX + tag
        try:
            answer = self._exchange("GET", path, None, {"If-None-Match": etag} if etag else None)
        except NotFoundError:
            return None
        except _RetryableError as exc:
            raise FetchError(str(exc)) from None
        if answer.status == 304:
            return answer
        if len(answer.body) > MAX_ARCHIVE_BYTES:
            raise FetchError(f"{path}: the answer is larger than {MAX_ARCHIVE_BYTES} bytes")
        if answer.etag != f'"{hashlib.sha256(answer.body).hexdigest()}"':
            raise FetchError(f"{path}: the answer's sha256 is not its ETag (cut short, or not a build)")
        return answer

    def send_report(self, report: dict[str, Any], deadline_s: float = 60.0,
                    report_key: str | None = None) -> dict[str, Any]:
        """POST /vllm/report, with the box's report key (the box JSON's report_key) when it has one."""
        data = self.call("POST", "/vllm/report", json.dumps(report).encode(), deadline_s=deadline_s,
                         headers={"X-Fleetllm-Report-Key": report_key} if report_key else None)
        try:
            answer = json.loads(data)
        except (ValueError, RecursionError):
            raise FetchError("/vllm/report: the answer is not JSON") from None
        return answer if isinstance(answer, dict) else {"answer": answer}
