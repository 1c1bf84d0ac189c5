"""External identity: JWTs from a trusted issuer authenticate on every surface API keys do.

A real identity provider runs on loopback (tests/identity_provider.py: OIDC discovery and a
JWKS with keys made here); the platform is served by a real uvicorn (``live_server_url``) and
calls go through the gateway (``/a2a/{id}``: JSON-RPC, HTTP+JSON, gRPC) to a real a2a-sdk agent,
through ``/api/v1``, the KubeMQ API, ARD, the MCP bridge and ``/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured

from registry import identity
from tests.conftest import make_client
from tests.identity_provider import AUDIENCE, IdentityProvider, SigningKey

pytestmark = pytest.mark.django_db(transaction=True)
V10 = {"A2A-Version": "1.0"}


@pytest.fixture(scope="module")
def keys() -> dict[str, SigningKey]:
    """Keys are slow to make (RSA): once per module."""
    return {"rsa": SigningKey("rsa-1"), "ec": SigningKey("ec-1", "ES256"),
            "next": SigningKey("rsa-2"), "stranger": SigningKey("rsa-x")}


@pytest.fixture
def idp(keys, settings):
    provider = IdentityProvider(keys["rsa"], keys["ec"])
    settings.A2A_JWT_ISSUERS = [{
        "issuer": provider.url, "audience": AUDIENCE, "name": "test-idp",
        "claims": {"allowed_agents": "agents", "tenant": "org"},
    }]
    settings.A2A_JWT_JWKS_MIN_REFRESH_SECONDS = 1.0
    yield provider
    provider.stop()


@pytest.fixture
def echo_agent(echo_agent_factory):
    """An SDK echo agent with JSON-RPC (1.0 and 0.3) and HTTP+JSON interfaces."""
    return echo_agent_factory(interfaces=[("JSONRPC", "1.0"), ("JSONRPC", "0.3"),
                                          ("HTTP+JSON", "1.0")])


@pytest.fixture
def agent_id(echo_agent, register_agent) -> str:
    return register_agent(echo_agent, "jwt-echo").agent_id


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _send(base: str, agent_id: str, token: str) -> httpx.Response:
    return httpx.post(
        f"{base}/a2a/{agent_id}", headers=_bearer(token), timeout=10,
        json={"jsonrpc": "2.0", "id": 1, "method": "message/send",
              "params": {"message": {"role": "user", "messageId": "m1",
                                     "parts": [{"kind": "text", "text": "hi"}]}}})


def _surfaces(base: str, agent_id: str, token: str) -> dict[str, httpx.Response]:
    """The same credential on each surface: the gateway (JSON-RPC and HTTP+JSON), /api/v1,
    KubeMQ, ARD, /metrics, the MCP bridge."""
    return {
        "a2a": _send(base, agent_id, token),
        "api": httpx.get(f"{base}/api/v1/agents/{agent_id}", headers=_bearer(token)),
        "kubemq": httpx.get(f"{base}/agents/{agent_id}", headers=_bearer(token)),
        "ard": httpx.get(f"{base}/ard/v1/agents", headers=_bearer(token)),
        "metrics": httpx.get(f"{base}/metrics", headers=_bearer(token)),
        "http+json": httpx.post(
            f"{base}/a2a/{agent_id}/message:send", headers={**_bearer(token), **V10}, timeout=10,
            json={"message": {"messageId": "m2", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}),
        "mcp": httpx.post(
            f"{base}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
            headers={**_bearer(token), "Accept": "application/json, text/event-stream",
                     "MCP-Protocol-Version": "2025-11-25"}),
    }


def test_jwt_is_accepted_on_every_surface_beside_api_keys(
        live_server_url, idp, agent_id, echo_agent, settings):
    settings.A2A_METRICS_REQUIRE_TOKEN = True
    token = idp.token(scope="a2a.call a2a.admin", agents=[agent_id], org="default")
    answers = _surfaces(live_server_url, agent_id, token)
    assert {name: r.status_code for name, r in answers.items()} == dict.fromkeys(answers, 200)
    assert "result" in answers["a2a"].json()
    assert answers["api"].json()["agent_id"] == agent_id
    # The agent learns who called: the JWT's issuer name and subject.
    assert echo_agent.requests[-1].header("x-kubemq-caller-id") == "jwt:test-idp:alice"
    # A call-only JWT calls its agent but reads no metrics (admin only), like a call-only key.
    caller = idp.token(scope="a2a.call", agents=[agent_id])
    assert _send(live_server_url, agent_id, caller).status_code == 200
    r = httpx.get(f"{live_server_url}/metrics", headers=_bearer(caller))
    assert r.status_code == 401
    # ...and no other agent: the allowed-agents claim is the API key's allowed list.
    r = _send(live_server_url, "other-agent", caller)
    assert r.status_code == 403
    # API keys keep working beside JWTs.
    _, key = make_client(["call"], [agent_id])
    assert _send(live_server_url, agent_id, key).status_code == 200
    assert httpx.get(f"{live_server_url}/agents/{agent_id}", headers=_bearer(key)).status_code \
        == 200
    # The keys were fetched once, through discovery, off the call path; later calls hit memory.
    assert idp.requests["/.well-known/openid-configuration"] == 1 and idp.jwks_fetches == 1


def test_scope_claim_maps_to_platform_scopes(live_server_url, idp, agent_id):
    nothing = idp.token(scope="openid profile", agents=[agent_id])
    r = _send(live_server_url, agent_id, nothing)
    assert r.status_code == 403 and r.json()["error"]["data"]["kind"] == "forbidden"
    # A configured allowed-agents claim that is missing refuses the token: an empty list
    # would mean "any agent".
    r = _send(live_server_url, agent_id, idp.token(scope="a2a.call"))
    assert r.status_code == 401 and "'agents' (allowed agents) missing" in r.text


def test_each_refusal_is_a_401_naming_its_reason(live_server_url, idp, agent_id, keys,
                                                   settings):
    settings.A2A_METRICS_REQUIRE_TOKEN = True
    good = {"scope": "a2a.call a2a.admin", "agents": [agent_id]}
    now = int(time.time())
    signed = idp.token(**good)
    head, body, sig = signed.split(".")
    cases = {
        "expired": idp.token(exp=now - 3600, iat=now - 7200, nbf=now - 7200, **good),
        "not yet valid": idp.token(nbf=now + 3600, **good),
        "wrong issuer": idp.token(iss="https://idp.example.com/realms/other", **good),
        "wrong audience": idp.token(aud="someone-else", **good),
        "unknown key": idp.token(keys["stranger"], **good),
        "alg none": idp.unsigned_token(**good),
        "symmetric algorithm": idp.hmac_with_public_key(keys["rsa"], **good),
        "larger than the 8192-byte cap": idp.token(padding="x" * 9000, **good),
        "bad signature": f"{head}.{idp.token(sub='mallory', **good).split('.')[1]}.{sig}",
    }
    for reason, token in cases.items():
        for surface, r in _surfaces(live_server_url, agent_id, token).items():
            assert r.status_code == 401, (reason, surface, r.status_code, r.text)
            assert reason in r.text, (reason, surface, r.text)
        # Asked again: the same answer (remembered, not re-verified; never a 500).
        r = _send(live_server_url, agent_id, token)
        assert r.status_code == 401 and reason in r.text
        assert r.headers["x-a2a-executed"] == "false"
    assert _send(live_server_url, agent_id, signed).status_code == 200


def test_key_rotation_fetches_the_new_key_once_and_bounded(live_server_url, idp, agent_id,
                                                           keys):
    claims = {"agents": [agent_id]}
    assert _send(live_server_url, agent_id, idp.token(**claims)).status_code == 200
    assert idp.jwks_fetches == 1
    idp.keys = [keys["next"], keys["rsa"]]  # the provider rotates: a new key, the old one kept
    time.sleep(1.1)  # past A2A_JWT_JWKS_MIN_REFRESH_SECONDS since the first fetch
    rotated = idp.token(keys["next"], **claims)
    assert _send(live_server_url, agent_id, rotated).status_code == 200
    assert idp.jwks_fetches == 2
    # Tokens naming kids nobody published: refused, and no fetch within the minimum interval.
    for n in range(10):
        r = _send(live_server_url, agent_id, idp.token(keys["stranger"], kid=f"rnd-{n}",
                                                       **claims))
        assert r.status_code == 401 and "unknown key" in r.text
    assert idp.jwks_fetches == 2
    # A key the provider withdrew stops verifying after the next refresh.
    idp.keys = [keys["next"]]
    time.sleep(1.1)
    r = _send(live_server_url, agent_id, idp.token(keys["stranger"], kid="rnd-late", **claims))
    assert r.status_code == 401 and idp.jwks_fetches == 3
    r = _send(live_server_url, agent_id, idp.token(keys["rsa"], **claims))
    assert r.status_code == 401 and "unknown key" in r.text


def test_identity_provider_down_after_first_verification(live_server_url, idp, agent_id,
                                                         settings):
    settings.A2A_AUTH_CACHE_SECONDS = 0.2  # re-verify soon: from the keys held in memory
    settings.A2A_JWT_JWKS_TTL_SECONDS = 1
    claims = {"agents": [agent_id]}
    token = idp.token(**claims)
    assert _send(live_server_url, agent_id, token).status_code == 200
    idp.stop()
    time.sleep(1.2)  # the token's cache entry and the key set are both past their lifetimes
    for _ in range(3):
        assert _send(live_server_url, agent_id, token).status_code == 200
        time.sleep(0.3)
    # A token never seen before, signed by a key held in memory: verified without the provider.
    assert _send(live_server_url, agent_id, idp.token(sub="bob", **claims)).status_code == 200
    # A key the platform never saw cannot be fetched: refused, never a 500.
    r = _send(live_server_url, agent_id, idp.token(kid="rsa-new", **claims))
    assert r.status_code == 401 and "unknown key" in r.text


def test_keys_never_fetched_answer_retryable(live_server_url, keys, settings, agent_id):
    provider = IdentityProvider(keys["rsa"])
    token = provider.token(agents=[agent_id])
    provider.stop()
    settings.A2A_JWT_ISSUERS = [{"issuer": provider.url, "audience": AUDIENCE}]
    r = _send(live_server_url, agent_id, token)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert "identity provider keys unavailable" in r.text


def test_jwks_file_and_jwks_uri_sources(live_server_url, keys, settings, agent_id, tmp_path):
    provider = IdentityProvider(keys["ec"])
    try:
        settings.A2A_JWT_ISSUERS = [{"issuer": provider.url, "audience": AUDIENCE,
                                     "jwks_uri": f"{provider.url}/jwks.json",
                                     "claims": {"scopes": "roles"},
                                     "scope_map": {"caller": ["call"]}}]
        token = provider.token(scope=None, roles=["caller"])
        assert _send(live_server_url, agent_id, token).status_code == 200
        assert provider.requests["/.well-known/openid-configuration"] == 0
        path = tmp_path / "jwks.json"
        path.write_text(json.dumps({"keys": [keys["ec"].jwk]}))
        settings.A2A_JWT_ISSUERS = [{"issuer": provider.url, "audience": AUDIENCE,
                                     "jwks_file": str(path)}]
        provider.stop()
        assert _send(live_server_url, agent_id, provider.token()).status_code == 200
    finally:
        provider.stop()


def test_off_without_issuers(live_server_url, keys, agent_id):
    provider = IdentityProvider(keys["rsa"])
    provider.stop()
    r = _send(live_server_url, agent_id, provider.token())
    assert r.status_code == 401 and "invalid or revoked token" in r.text


@pytest.mark.parametrize(("entry", "message"), [
    ({"audience": "x"}, '"issuer"'),
    ({"issuer": "https://idp.example.com"}, '"audience"'),
    ({"issuer": "https://idp.example.com", "audience": "x", "algorithms": ["HS256"]},
     "asymmetric only"),
    ({"issuer": "https://idp.example.com", "audience": "x", "scope_map": {"a": ["root"]}},
     "unknown platform scope"),
    ({"issuer": "http://169.254.169.254/", "audience": "x"}, "refused"),
    ({"issuer": "https://idp.example.com", "audience": "x", "jwks": "y"}, "unknown key"),
])
def test_configuration_errors_name_the_entry(entry, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        identity.parse_issuers([entry])


def test_jwt_registrar_manages_the_agents_its_claim_names(live_server_url, idp, agent_id,
                                                          echo_agent):
    token = idp.token(scope="a2a.register a2a.call", agents=["jwt-own", agent_id])
    auth = _bearer(token)
    r = httpx.post(f"{live_server_url}/api/v1/agents", headers=auth,
                   json={"agent_id": "jwt-own", "url": echo_agent.url,
                         "card": echo_agent.card_document})
    assert r.status_code == 201, r.text
    r = httpx.post(f"{live_server_url}/api/v1/agents/jwt-own/heartbeat", headers=auth)
    assert r.status_code == 200, r.text
    r = httpx.post(f"{live_server_url}/agents/heartbeat", headers=auth,
                   json={"agent_id": "jwt-own"})
    assert r.status_code == 200, r.text
    assert _send(live_server_url, "jwt-own", token).status_code == 200
    # An agent an API client owns stays that client's, whatever the claim names.
    r = httpx.delete(f"{live_server_url}/api/v1/agents/{agent_id}", headers=auth)
    assert r.status_code == 403, r.text
    r = httpx.post(f"{live_server_url}/agents/heartbeat", headers=auth,
                   json={"agent_id": agent_id})
    assert r.status_code == 403, r.text
    # Another JWT caller whose claim does not name it cannot touch it.
    other = _bearer(idp.token(sub="bob", scope="a2a.register", agents=["elsewhere"]))
    r = httpx.delete(f"{live_server_url}/api/v1/agents/jwt-own", headers=other)
    assert r.status_code in (403, 404), r.text
    r = httpx.delete(f"{live_server_url}/api/v1/agents/jwt-own", headers=auth)
    assert r.status_code == 204, r.text


@pytest.fixture
def grpc_listener(settings):
    """The node's gRPC listener on a free port (set before the live server starts)."""
    settings.A2A_GRPC_PORT = 0


async def test_jwt_on_the_grpc_binding(grpc_listener, live_server_url, idp, agent_id):
    import grpc
    from a2a.types import a2a_pb2
    from a2a.types import a2a_pb2_grpc as grpc10

    from core import lifecycle as node_config
    from gateway import runtime
    from tests.a2a_agents import user_message

    address = f"127.0.0.1:{node_config.grpc_port()}"
    request = a2a_pb2.SendMessageRequest(tenant=agent_id, message=user_message("hi").message)
    good = idp.token(agents=[agent_id])
    expired = idp.token(agents=[agent_id], exp=int(time.time()) - 3600)

    async def calls():
        async with grpc.aio.insecure_channel(address) as channel:
            stub = grpc10.A2AServiceStub(channel)
            reply = await stub.SendMessage(request, metadata=(("authorization",
                                                               f"Bearer {good}"),))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.SendMessage(request, metadata=(("authorization",
                                                           f"Bearer {expired}"),))
            return reply, refused.value

    # On the node's loop: grpcio's asyncio layer serves one event loop per process.
    loop = runtime.current_node().loop
    reply, refused = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(calls(), loop))
    assert reply.HasField("message") or reply.HasField("task")
    assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "expired" in refused.details()


def test_malformed_jwts_are_401_never_500(live_server_url, idp, agent_id, keys, settings):
    settings.A2A_METRICS_REQUIRE_TOKEN = True
    import base64

    def b64(value) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    good = idp.token(agents=[agent_id])
    head, body, sig = good.split(".")
    garbage = [
        "a.b.c", "..", f"{head}..", f"{head}.{body}.", "%%.~~.!!",
        f"{b64([1])}.{body}.{sig}",  # a header that is not an object
        f"{b64({'alg': 'RS256', 'kid': ['x']})}.{body}.{sig}",  # a kid that is not a string
        f"{head}.{b64({**idp.claims(agents=[agent_id]), 'exp': 'soon'})}.{sig}",
        f"{head}.{b64({**idp.claims(agents=[agent_id]), 'iss': ['a', 'b']})}.{sig}",
        idp.token(agents=[agent_id], aud=7),
        idp.token(agents=[agent_id], sub=None),
    ]
    for token in garbage:
        for surface, r in _surfaces(live_server_url, agent_id, token).items():
            assert r.status_code == 401, (token, surface, r.status_code, r.text)
    assert _send(live_server_url, agent_id, good).status_code == 200


def test_a_cached_jwt_is_never_served_past_its_exp(live_server_url, idp, agent_id, settings):
    settings.A2A_JWT_LEEWAY_SECONDS = 0
    settings.A2A_AUTH_CACHE_SECONDS = 30  # far longer than the token lives
    token = idp.token(agents=[agent_id], exp=int(time.time()) + 2)
    assert _send(live_server_url, agent_id, token).status_code == 200
    assert _send(live_server_url, agent_id, token).status_code == 200  # from the cache
    time.sleep(2.5)
    r = _send(live_server_url, agent_id, token)
    assert r.status_code == 401 and "expired" in r.text
    r = httpx.get(f"{live_server_url}/api/v1/agents/{agent_id}", headers=_bearer(token))
    assert r.status_code == 401 and "expired" in r.text


def test_claim_mappings(settings):
    settings.A2A_JWT_ISSUERS = [{
        "issuer": "https://sso.example.com/realms/acme", "audience": "a2a",
        "claims": {"scopes": "realm_access.roles", "subject": "oid", "tenant": "tid"},
        "scope_map": {"a2a-caller": ["call"], "a2a-registrar": ["register", "call"]},
    }]
    issuer = identity.issuers()["https://sso.example.com/realms/acme"].issuer
    claims = {"oid": "u-1", "tid": "acme", "realm_access": {"roles": ["a2a-registrar", "x"]}}
    actor = identity._actor(issuer, claims)
    # register dropped: no allowed-agents claim configured, so it would reach every unowned agent
    assert actor.scopes == frozenset({"call"}) and actor.allowed_agents == frozenset()
    assert (actor.client_id, actor.tenant, actor.external) == \
        ("jwt:sso.example.com:u-1", "acme", True)
    assert issuer.scopes({"realm_access": {"roles": "a2a-caller,a2a-registrar"}}) == \
        frozenset({"call", "register"})
    assert issuer.scopes({}) == frozenset()


def test_a_wrong_issuer_entry_stops_the_node_at_start_naming_it(tmp_path):
    from tests.servers import fresh_env, run_manage

    env = fresh_env(tmp_path, A2A_JWT_ISSUERS='[{"issuer": "https://sso.example.com", '
                                              '"audience": "a2a", "algorithms": ["HS256"]}]')
    result = run_manage(env, "check", check=False)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith(
        "configuration error: A2A_JWT_ISSUERS[0]: algorithms ['HS256'] not accepted"), \
        result.stderr
