"""The single sign-on client's verification (reconciler/fleetllm/adapters/oidc.py) against a provider's
discovery document and JWKS served over loopback HTTP, with tokens this test signs: a real one passes;
forged ones (another key, a key the provider does not publish, `none`, HMAC keyed with the public key),
and tokens for another client, from another issuer, expired, not yet valid, with another sign-in's
nonce or without exp are refused, each with a message that says why and never holds the token."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from joserfc import jwt
from joserfc.jwk import OctKey, RSAKey

from fleetllm.adapters.oidc import (
    KEYS_REFRESH_MIN_S,
    OidcClient,
    OidcConfig,
    ProviderError,
    TokenRefused,
    groups_of,
    parse_metadata,
)
from fleetllm.core.secret import Secret
from tests.support.write_killer import ThreadedServer

CLIENT = "fleetllm-test"
NONCE = "nonce-of-this-sign-in"


def rsa_key(kid: str) -> RSAKey:
    return RSAKey.generate_key(2048, parameters={"kid": kid, "alg": "RS256", "use": "sig"}, private=True)


@dataclass
class Provider:
    """Discovery and JWKS of a provider, served by aiohttp on a loopback port."""

    keys: list[RSAKey] = field(default_factory=lambda: [rsa_key("k1")])
    issuer: str = ""
    said_issuer: str | None = None  # what the discovery document claims (None: the issuer)
    jwks_reads: int = 0

    def app(self) -> web.Application:
        async def discovery(_: web.Request) -> web.Response:
            return web.json_response({
                "issuer": self.said_issuer or self.issuer, "authorization_endpoint": f"{self.issuer}/authorize",
                "token_endpoint": f"{self.issuer}/token", "jwks_uri": f"{self.issuer}/jwks",
                "end_session_endpoint": f"{self.issuer}/logout",
                "id_token_signing_alg_values_supported": ["RS256", "HS256", "none"]})

        async def jwks(_: web.Request) -> web.Response:
            self.jwks_reads += 1
            return web.json_response({"keys": [k.as_dict(private=False) for k in self.keys]})

        app = web.Application()
        app.router.add_get("/.well-known/openid-configuration", discovery)
        app.router.add_get("/jwks", jwks)
        return app


@pytest.fixture
def provider() -> Iterator[Provider]:
    served = Provider()
    with ThreadedServer(served.app()) as server:
        served.issuer = server.url
        yield served


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def config(issuer: str, **changes: Any) -> OidcConfig:
    values: dict[str, Any] = {
        "issuer": issuer, "client_id": CLIENT, "client_secret": Secret("client-secret-0123456789", "${env:CS}"),
        "redirect_base": "http://127.0.0.1:1", "scopes": ("openid", "email"), "groups_claim": ("groups",),
        "roles": {"ops": "operator"}, "accept_bearer_jwts": True, "leeway_s": 30, "timeout_s": 5.0, **changes}
    return OidcConfig(**values)


def client(provider: Provider, clock: Clock | None = None, **changes: Any) -> OidcClient:
    return OidcClient(config(provider.issuer, **changes), clock or Clock())


def claims(provider: Provider, **changes: Any) -> dict[str, Any]:
    now = int(time.time())
    values: dict[str, Any] = {"iss": provider.issuer, "sub": "alice-123", "aud": CLIENT, "iat": now, "exp": now + 300,
                              "nonce": NONCE, "email": "alice@example.com", "name": "Alice", "groups": ["ops"]}
    values.update(changes)
    return {k: v for k, v in values.items() if v is not None}


def sign(values: dict[str, Any], key: RSAKey | OctKey, alg: str = "RS256", kid: str | None = "k1") -> str:
    header = {"alg": alg, **({"kid": kid} if kid else {})}
    return jwt.encode(header, values, key, algorithms=[alg])


def b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def refused(oidc: OidcClient, token: str, nonce: str | None = NONCE) -> str:
    with pytest.raises(TokenRefused) as caught:
        oidc.verify_id_token(token, nonce)
    message = str(caught.value)
    signature = token.split(".")[2] if token.count(".") == 2 else token
    assert token not in message and (not signature or signature not in message)
    return message


def test_a_token_the_provider_signed_for_this_client_passes(provider: Provider) -> None:
    identity = client(provider).verify_id_token(sign(claims(provider), provider.keys[0]), NONCE)
    assert (identity.subject, identity.email, identity.name, identity.groups) == (
        "alice-123", "alice@example.com", "Alice", ("ops",))
    assert identity.expires_at > time.time()


def test_forged_tokens_are_refused_saying_why(provider: Provider) -> None:
    oidc = client(provider)
    good = claims(provider)
    impostor = rsa_key("k1")  # the same key id, another key
    assert "signature does not verify against the keys of" in refused(oidc, sign(good, impostor))
    assert "forged or altered" in refused(oidc, sign(good, impostor))
    assert "signed with a key" in refused(oidc, sign(good, rsa_key("k9"), kid="k9"))
    real = sign(good, provider.keys[0])
    header, _, signature = real.split(".")
    altered = ".".join((header, b64({**good, "groups": ["admins"]}), signature))  # a group added after signing
    assert "forged or altered" in refused(oidc, altered)
    unsigned = ".".join((b64({"alg": "none", "kid": "k1"}), b64(good), ""))
    assert "cannot be verified" in refused(oidc, unsigned)
    public_as_secret = OctKey.import_key(json.dumps(provider.keys[0].as_dict(private=False)).encode())
    assert "cannot be verified" in refused(oidc, sign(good, public_as_secret, alg="HS256"))  # HS* is never taken
    assert "not a signed JWT" in refused(oidc, "not-a-jwt")


def test_tokens_that_do_not_hold_are_refused_saying_why(provider: Provider) -> None:
    oidc = client(provider)
    key = provider.keys[0]
    now = int(time.time())
    assert "issued to another client" in refused(oidc, sign(claims(provider, aud="someone-else"), key))
    assert "issued to another client" in refused(oidc, sign(claims(provider, aud=["a", "b"], azp="a"), key))
    assert "another issuer" in refused(oidc, sign(claims(provider, iss="https://evil.example"), key))
    assert "has expired" in refused(oidc, sign(claims(provider, iat=now - 900, exp=now - 600), key))
    assert "not valid yet" in refused(oidc, sign(claims(provider, iat=now + 900, exp=now + 1200), key))
    assert "nonce is not this sign-in's" in refused(oidc, sign(claims(provider, nonce="another"), key))
    assert "lacks the nonce claim" in refused(oidc, sign(claims(provider, nonce=None), key))
    assert "lacks the exp claim" in refused(oidc, sign(claims(provider, exp=None), key))
    assert "lacks the sub claim" in refused(oidc, sign(claims(provider, sub=None), key))


def test_clock_skew_within_the_leeway_is_allowed(provider: Provider) -> None:
    clock = Clock()
    oidc = client(provider, clock, leeway_s=60)
    token = sign(claims(provider, exp=int(clock.now) - 20), provider.keys[0])
    assert oidc.verify_id_token(token, NONCE).subject == "alice-123"
    clock.now += 60
    assert "has expired" in refused(oidc, token)


def test_a_rotated_key_is_fetched_once_and_unknown_keys_do_not_hammer_the_provider(provider: Provider) -> None:
    clock = Clock()
    oidc = client(provider, clock)
    assert oidc.verify_id_token(sign(claims(provider), provider.keys[0]), NONCE)
    assert provider.jwks_reads == 1
    clock.now += KEYS_REFRESH_MIN_S + 1
    provider.keys.append(rsa_key("k2"))  # the provider rotates: tokens signed with k2 appear
    assert oidc.verify_id_token(sign(claims(provider), provider.keys[1], kid="k2"), NONCE)
    assert provider.jwks_reads == 2
    for i in range(5):  # forged key ids, one after another: the keys are not read again each time
        refused(oidc, sign(claims(provider), rsa_key(f"x{i}"), kid=f"x{i}"))
    assert provider.jwks_reads == 2


def test_bearer_jwts_need_this_client_as_audience_and_no_nonce(provider: Provider) -> None:
    oidc = client(provider)
    key = provider.keys[0]
    machine = claims(provider, sub="ci-robot", nonce=None, email=None, azp="ci-robot")  # a client-credentials token
    identity = oidc.verify_bearer(sign(machine, key))
    assert (identity.subject, identity.email, identity.groups) == ("ci-robot", None, ("ops",))
    with pytest.raises(TokenRefused, match="issued to another client"):
        oidc.verify_bearer(sign({**machine, "aud": "another-api"}, key))
    with pytest.raises(TokenRefused, match="forged or altered"):
        oidc.verify_bearer(sign(machine, rsa_key("k1")))


def test_the_discovery_document_must_name_the_configured_issuer(provider: Provider) -> None:
    provider.said_issuer = "https://evil.example"
    with pytest.raises(ProviderError, match=r"auth\.oidc\.issuer must be exactly the provider's issuer"):
        client(provider).metadata()
    with pytest.raises(ProviderError, match="cannot read the discovery document"):
        OidcClient(config("http://127.0.0.1:9"), Clock()).metadata()


def test_discovery_drops_unsafe_algorithms_and_finds_the_logout() -> None:
    document = {"issuer": "https://sso.example/", "authorization_endpoint": "https://sso.example/a",
                "token_endpoint": "https://sso.example/t", "jwks_uri": "https://sso.example/k",
                "id_token_signing_alg_values_supported": ["none", "HS256", "ES256"],
                "token_endpoint_auth_methods_supported": ["client_secret_post"]}
    metadata = parse_metadata(document, "https://sso.example")
    assert metadata.algorithms == ("ES256",) and metadata.end_session_endpoint is None
    assert metadata.token_auth_method == "client_secret_post"
    with pytest.raises(ProviderError, match="no usable jwks_uri"):
        parse_metadata({**document, "jwks_uri": None}, "https://sso.example")


def test_the_groups_claim_may_be_nested_or_a_single_string() -> None:
    token = {"groups": ["a", 3, "b"], "realm_access": {"roles": ["fleet-admin"]}, "group": "one"}
    assert groups_of(token, ("groups",)) == ("a", "b")
    assert groups_of(token, ("realm_access", "roles")) == ("fleet-admin",)
    assert groups_of(token, ("group",)) == ("one",)
    assert groups_of(token, ("missing", "path")) == ()


def test_the_logout_url_names_the_client_and_where_to_come_back(provider: Provider) -> None:
    url = client(provider).logout_url("http://127.0.0.1:1/login")
    assert url == (f"{provider.issuer}/logout?client_id={CLIENT}"
                   "&post_logout_redirect_uri=http%3A%2F%2F127.0.0.1%3A1%2Flogin")


def test_an_authorization_request_carries_state_nonce_and_an_s256_challenge(provider: Provider) -> None:
    from urllib.parse import parse_qs, urlsplit

    from authlib.oauth2.rfc7636 import create_s256_code_challenge

    login = client(provider).begin()
    query = {k: v[0] for k, v in parse_qs(urlsplit(login.url).query).items()}
    assert login.url.startswith(f"{provider.issuer}/authorize?")
    assert query["state"] == login.state and query["nonce"] == login.nonce and query["response_type"] == "code"
    assert query["code_challenge_method"] == "S256"
    assert query["code_challenge"] == create_s256_code_challenge(login.code_verifier)
    assert query["client_id"] == CLIENT and query["redirect_uri"] == "http://127.0.0.1:1/oidc/callback"
    assert "client-secret" not in login.url
    assert len({login.state, login.nonce, login.code_verifier}) == 3
