"""OpenID Connect, the client's side (auth.oidc): the provider's discovery document and signing keys, the
authorization-code flow with PKCE, and the verification of what the provider signs.

Authlib does the protocol: its OAuth2 client (`authlib.integrations.requests_client.OAuth2Session`) builds
the authorization URL (state, nonce, the S256 code challenge) and exchanges the code at the token
endpoint with the client's secret; its `CodeIDToken` checks an ID token's claims (iss, aud, exp, iat,
nonce, azp, at_hash); joserfc, Authlib's JOSE library, checks the signature against the provider's JWKS.

- Discovery: ISSUER/.well-known/openid-configuration, read on first use (never at start-up, so the
  control plane starts while the provider is down), kept METADATA_TTL_S; its `issuer` must be the
  configured one.
- Keys: the document's jwks_uri, kept KEYS_TTL_S, read again at once for a key id it does not hold (the
  provider rotated), at most once every KEYS_REFRESH_MIN_S (a stream of forged key ids cannot make
  this process hammer the provider).
- Algorithms: the provider's advertised asymmetric ones; `none` and the HMAC ones are never accepted
  (an HMAC "signature" keyed with a public key is the classic forgery).

Nothing here logs or returns a code, a token or the client secret: errors say what was wrong with them.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlencode

import requests
from authlib.integrations.base_client.errors import OAuthError
from authlib.integrations.requests_client import OAuth2Session
from authlib.oauth2.claims import JWTClaims
from authlib.oidc.core import CodeIDToken
from joserfc import jwt
from joserfc.errors import (
    BadSignatureError,
    ExpiredTokenError,
    InvalidClaimError,
    InvalidKeyIdError,
    JoseError,
    MissingClaimError,
)
from joserfc.jwk import KeySet
from joserfc.jws import JWSRegistry

from fleetllm.core.secret import Secret
from fleetllm.errors import RequestError, UpstreamError

METADATA_TTL_S = 3600.0
KEYS_TTL_S = 3600.0
KEYS_REFRESH_MIN_S = 30.0
MAX_DOCUMENT_BYTES = 512 * 1024  # a discovery document or a key set
MAX_TOKEN_CHARS = 16 * 1024  # a JWT longer than this is refused unread
REFUSED_ALGORITHMS = frozenset({"none", "HS256", "HS384", "HS512"})
DEFAULT_ALGORITHMS = ("RS256",)  # what OIDC requires every provider to support


@dataclass(frozen=True)
class OidcConfig:
    """auth.oidc of the settings (fleetllm.settings builds it): the provider, this client, the role mapping."""

    issuer: str  # as the provider's ID tokens say it in `iss` (a trailing slash as configured)
    client_id: str
    client_secret: Secret
    redirect_base: str  # scheme://host[:port] as browsers reach the control plane, no trailing slash
    scopes: tuple[str, ...]  # always with openid
    groups_claim: tuple[str, ...]  # the claim's path: ("groups",), ("realm_access", "roles")
    roles: Mapping[str, str]  # group -> "viewer" | "operator" | "admin"
    accept_bearer_jwts: bool
    leeway_s: int
    timeout_s: float

    @property
    def callback_url(self) -> str:
        return f"{self.redirect_base}/oidc/callback"


class ProviderError(UpstreamError):
    """The provider could not be reached, or answered something that is not OpenID Connect."""


class TokenRefused(RequestError):  # noqa: N818 (what happened to the token)
    """A code, an ID token or a bearer JWT that does not hold: the message says why (never the token)."""


@dataclass(frozen=True)
class Metadata:
    """The parts of the discovery document this client uses."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    end_session_endpoint: str | None
    algorithms: tuple[str, ...]
    token_auth_method: str  # client_secret_basic, else client_secret_post (whichever the provider takes)


@dataclass(frozen=True)
class LoginRequest:
    """One login under way: where to send the browser, and what the callback must be checked against."""

    url: str
    state: str
    nonce: str
    code_verifier: str


@dataclass(frozen=True)
class Identity:
    """Who the provider says signed in (or whom a bearer JWT stands for)."""

    subject: str
    email: str | None
    name: str | None
    groups: tuple[str, ...]
    expires_at: float  # the token's exp


def _url(metadata: Mapping[str, Any], key: str, required: bool = True) -> str | None:
    value = metadata.get(key)
    if isinstance(value, str) and value.startswith(("https://", "http://")):
        return value
    if required:
        raise ProviderError(f"the provider's discovery document has no usable {key}: it is not an OpenID "
                            "Connect provider, or auth.oidc.issuer names the wrong URL")
    return None


def parse_metadata(document: Mapping[str, Any], issuer: str) -> Metadata:
    """The discovery document, checked: its issuer is the configured one (OpenID Connect Discovery 4.3)."""
    said = document.get("issuer")
    if not isinstance(said, str) or said.rstrip("/") != issuer.rstrip("/"):
        raise ProviderError(f"the discovery document of {issuer} names issuer {said!r}: auth.oidc.issuer must be "
                            "exactly the provider's issuer")
    advertised = document.get("id_token_signing_alg_values_supported")
    usable = tuple(a for a in advertised if isinstance(a, str) and a not in REFUSED_ALGORITHMS) \
        if isinstance(advertised, list) else ()
    methods = document.get("token_endpoint_auth_methods_supported")
    basic = not isinstance(methods, list) or "client_secret_basic" in methods
    return Metadata(said, cast(str, _url(document, "authorization_endpoint")),
                    cast(str, _url(document, "token_endpoint")), cast(str, _url(document, "jwks_uri")),
                    _url(document, "end_session_endpoint", required=False),
                    usable or DEFAULT_ALGORITHMS, "client_secret_basic" if basic else "client_secret_post")


def claim_at(claims: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = claims
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def groups_of(claims: Mapping[str, Any], path: tuple[str, ...]) -> tuple[str, ...]:
    """The groups claim (auth.oidc.groups_claim): a list of strings, or one string; else none."""
    value = claim_at(claims, path)
    if isinstance(value, str):
        return (value,)
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def _text(value: object, limit: int = 320) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


class OidcClient:
    """One provider, one client (auth.oidc). Thread-safe: request threads share it."""

    def __init__(self, config: OidcConfig, clock: Any = time.time) -> None:
        self.config = config
        self.clock = clock
        self._lock = threading.Lock()
        self._metadata: Metadata | None = None
        self._metadata_until = 0.0
        self._keys: KeySet | None = None
        self._keys_until = 0.0
        self._keys_read_at = -KEYS_REFRESH_MIN_S

    # the provider's documents
    def _get_json(self, url: str, what: str) -> dict[str, Any]:
        try:  # a session per read (requests' sessions are not thread-safe); documents are read about hourly
            with requests.Session() as http:
                response = http.get(url, timeout=self.config.timeout_s, headers={"Accept": "application/json"},
                                    stream=True)
                body = response.raw.read(MAX_DOCUMENT_BYTES + 1, decode_content=True)
        except requests.RequestException as exc:
            raise ProviderError(f"cannot read the {what} of the single sign-on provider at {url}: "
                                f"{type(exc).__name__}") from None
        if response.status_code != 200 or len(body) > MAX_DOCUMENT_BYTES:
            raise ProviderError(f"the single sign-on provider answered {response.status_code} for its {what} at "
                                f"{url}" + ("" if response.status_code != 200 else " (too large)"))
        try:
            document = json.loads(body)
        except ValueError:
            document = None
        if not isinstance(document, dict):
            raise ProviderError(f"the {what} at {url} is not a JSON object")
        return document

    def metadata(self) -> Metadata:
        now = self.clock()
        with self._lock:
            if self._metadata is not None and now < self._metadata_until:
                return self._metadata
        url = self.config.issuer.rstrip("/") + "/.well-known/openid-configuration"
        metadata = parse_metadata(self._get_json(url, "discovery document"), self.config.issuer)
        with self._lock:
            self._metadata, self._metadata_until = metadata, now + METADATA_TTL_S
        return metadata

    def keys(self, *, refresh: bool = False) -> KeySet:
        """The provider's signing keys; `refresh` reads them again (a key id they do not hold), at most once
        every KEYS_REFRESH_MIN_S."""
        now = self.clock()
        with self._lock:
            fresh = self._keys is not None and now < self._keys_until
            throttled = now - self._keys_read_at < KEYS_REFRESH_MIN_S
            if self._keys is not None and ((fresh and not refresh) or throttled):
                return self._keys
        uri = self.metadata().jwks_uri
        document = self._get_json(uri, "signing keys")
        try:
            keys = KeySet.import_key_set(cast(Any, document))
        except (JoseError, ValueError, TypeError, KeyError) as exc:
            raise ProviderError(f"the signing keys at {uri} are not a usable JWK set: {type(exc).__name__}") from None
        with self._lock:
            self._keys, self._keys_until, self._keys_read_at = keys, now + KEYS_TTL_S, now
        return keys

    # the authorization-code flow
    def _session(self, metadata: Metadata) -> OAuth2Session:
        return OAuth2Session(self.config.client_id, self.config.client_secret.reveal(),
                             scope=" ".join(self.config.scopes), redirect_uri=self.config.callback_url,
                             code_challenge_method="S256", token_endpoint_auth_method=metadata.token_auth_method)

    def begin(self) -> LoginRequest:
        """A new login: the provider's authorization URL with a fresh state, nonce and S256 code challenge."""
        metadata = self.metadata()
        state, nonce, verifier = (secrets.token_urlsafe(32), secrets.token_urlsafe(32), secrets.token_urlsafe(48))
        with self._session(metadata) as session:
            url, _ = session.create_authorization_url(metadata.authorization_endpoint, state=state,
                                                      code_verifier=verifier, nonce=nonce)
        return LoginRequest(url, state, nonce, verifier)

    def finish(self, code: str, login: LoginRequest) -> Identity:
        """Exchange the callback's code (with the login's code verifier) and verify the ID token it brings
        (against the login's nonce). Raises TokenRefused or ProviderError."""
        metadata = self.metadata()
        with self._session(metadata) as session:
            try:
                token = session.fetch_token(metadata.token_endpoint, code=code, code_verifier=login.code_verifier,
                                            grant_type="authorization_code", timeout=self.config.timeout_s)
            except OAuthError as exc:
                said = _text(exc.error, 80) or "an error"
                detail = _text(exc.description, 200)
                raise TokenRefused(f"the provider refused the sign-in code ({said}{': ' + detail if detail else ''}): "
                                   "sign in again") from None
            except requests.RequestException as exc:
                raise ProviderError(f"cannot reach the provider's token endpoint {metadata.token_endpoint}: "
                                    f"{type(exc).__name__}") from None
            except ValueError:
                raise ProviderError(f"the provider's token endpoint {metadata.token_endpoint} did not answer "
                                    "a token response") from None
        id_token = token.get("id_token") if isinstance(token, Mapping) else None
        if not isinstance(id_token, str):
            raise ProviderError("the provider's token response has no ID token: include the openid scope "
                                "(auth.oidc.scopes), and let this client use the authorization-code flow")
        access = token.get("access_token")
        return self.verify_id_token(id_token, login.nonce, access if isinstance(access, str) else None)

    def logout_url(self, post_logout_redirect: str) -> str | None:
        """The provider's end-session endpoint (RP-initiated logout) when it advertises one, else None."""
        try:
            endpoint = self.metadata().end_session_endpoint
        except ProviderError:
            return None
        if endpoint is None:
            return None
        query = urlencode({"client_id": self.config.client_id, "post_logout_redirect_uri": post_logout_redirect})
        return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"

    # verification
    def _decode(self, token: str, what: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The header and claims of a JWT whose signature verifies against the provider's keys."""
        if len(token) > MAX_TOKEN_CHARS or token.count(".") != 2:
            raise TokenRefused(f"the {what} is not a signed JWT (header.payload.signature)")
        registry = JWSRegistry(algorithms=list(self.metadata().algorithms))
        try:
            try:
                decoded = jwt.decode(token, self.keys(), registry=registry)
            except InvalidKeyIdError:
                decoded = jwt.decode(token, self.keys(refresh=True), registry=registry)
        except InvalidKeyIdError:
            raise TokenRefused(f"the {what} is signed with a key {self.config.issuer} does not publish: it was "
                               "not issued by the configured provider") from None
        except BadSignatureError:
            raise TokenRefused(f"the {what}'s signature does not verify against the keys of {self.config.issuer}: "
                               "it was forged or altered") from None
        except JoseError as exc:
            raise TokenRefused(f"the {what} cannot be verified ({exc.error}): only tokens signed by "
                               f"{self.config.issuer} with {', '.join(self.metadata().algorithms)} are accepted") \
                from None
        return dict(decoded.header), dict(decoded.claims)

    def _claims_options(self) -> dict[str, Any]:
        return {"iss": {"essential": True, "value": self.metadata().issuer},
                "aud": {"essential": True, "value": self.config.client_id},
                "exp": {"essential": True}, "sub": {"essential": True}}

    def _identity(self, claims: Mapping[str, Any]) -> Identity:
        subject = claims["sub"]
        if not isinstance(subject, str) or not subject:
            raise TokenRefused("the token's subject (sub) is not a string")
        return Identity(subject[:255], _text(claims.get("email")), _text(claims.get("name")),
                        groups_of(claims, self.config.groups_claim), float(claims["exp"]))

    def verify_id_token(self, token: str, nonce: str | None, access_token: str | None = None) -> Identity:
        """An ID token from the token endpoint: signature, then Authlib's ID token checks (iss, aud, exp, iat,
        nonce, azp, at_hash) within auth.oidc.leeway_s."""
        header, claims = self._decode(token, "ID token")
        params: dict[str, Any] = {"client_id": self.config.client_id, "nonce": nonce}
        if access_token is not None:
            params["access_token"] = access_token
        checked = CodeIDToken(claims, cast(Any, header), self._claims_options(), params)
        self._validate(checked, "ID token")
        return self._identity(checked)

    def verify_bearer(self, token: str) -> Identity:
        """A JWT sent as Authorization: Bearer (auth.oidc.accept_bearer_jwts): signature, iss, aud (this
        client), exp, nbf, iat. No nonce: a bearer was not asked for by this process."""
        header, claims = self._decode(token, "bearer token")
        checked = JWTClaims(claims, cast(Any, header), self._claims_options())
        self._validate(checked, "bearer token")
        return self._identity(checked)

    def _validate(self, claims: JWTClaims | CodeIDToken, what: str) -> None:
        now, leeway = int(self.clock()), self.config.leeway_s
        try:
            claims.validate(now=now, leeway=leeway)
        except ExpiredTokenError:
            raise TokenRefused(f"the {what} has expired (exp is past, beyond {leeway} s of clock skew): sign in "
                               "again") from None
        except MissingClaimError as exc:
            raise TokenRefused(f"the {what} lacks the {exc.claim} claim") from None
        except InvalidClaimError as exc:
            raise TokenRefused(self._invalid(exc.claim, what)) from None
        except JoseError as exc:
            raise TokenRefused(f"the {what} does not hold ({exc.error})") from None

    def _invalid(self, claim: str, what: str) -> str:
        if claim == "aud":
            return (f"the {what} was issued to another client (its aud does not name {self.config.client_id!r}): "
                    "it is not for this control plane")
        if claim == "iss":
            return f"the {what} was issued by another issuer than {self.config.issuer}"
        if claim == "nonce":
            return f"the {what}'s nonce is not this sign-in's: a replayed or injected token; sign in again"
        if claim == "azp":
            return f"the {what} was issued to another party (its azp is not {self.config.client_id!r})"
        if claim in ("iat", "nbf"):
            return f"the {what} is not valid yet ({claim} is in the future beyond the allowed clock skew)"
        return f"the {what}'s {claim} claim is not valid"
