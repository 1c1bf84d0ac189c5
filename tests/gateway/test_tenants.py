"""Tenants (docs/tenants.md) on the live platform with real a2a-sdk agents: two tenants'
agents with the same id never collide, and a tenant's callers -- API keys and JWTs -- can
neither read, list, manage, heartbeat, call nor find another tenant's agents, nor learn that
they exist (the refusal is the unknown agent's answer, byte for byte but the id typed)."""

from __future__ import annotations

import httpx
import pytest

from registry import services
from registry.models import Agent
from tests.identity_provider import IdentityProvider, SigningKey
from tests.mcp_bridge.clients import all_tools, run

AUDIENCE = "a2a-registry"
RPC = {"jsonrpc": "2.0", "id": 7, "method": "message/send",
       "params": {"message": {"role": "user", "messageId": "m1",
                              "parts": [{"kind": "text", "text": "hi"}]}}}


def _client(tenant: str, scopes: list[str], agents: list[str] | None = None) -> str:
    return services.api_client_create(name=f"{tenant}-{'-'.join(scopes)}", scopes=scopes,
                                      allowed_agents=agents, tenant=tenant)[1]


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def tenants(live_server_url, echo_agent_factory):
    """Tenants acme and beta, each with a register+call client and an agent named ``echo`` (its
    own SDK agent), and beta's ``secret`` too."""
    for slug in ("acme", "beta", "gamma"):
        services.tenant_create(slug=slug)
    world = {"url": live_server_url, "agents": {}}
    for slug in ("acme", "beta"):
        token = _client(slug, ["register", "call"])
        world[slug] = token
        for name in ("echo", "secret") if slug == "beta" else ("echo",):
            agent = echo_agent_factory(card_shape="both")
            r = httpx.post(f"{live_server_url}/api/v1/agents", headers=_auth(token),
                           json={"agent_id": name, "url": agent.url,
                                 "card": agent.card_document})
            assert r.status_code == 201, r.text
            assert (r.json()["agent_id"], r.json()["tenant"]) == (name, slug)
            world["agents"][f"{slug}.{name}"] = agent
    world["gamma"] = _client("gamma", ["call"])
    return world


def _posts(agent) -> int:
    return len([r for r in agent.requests if r.http_method == "POST"])


def _same_refusal(a: httpx.Response, b: httpx.Response, a_id: str, b_id: str) -> None:
    """Two refusals are one answer: status, and body once the id each names is set aside."""
    assert a.status_code == b.status_code, (a.text, b.text)
    assert a.text.replace(a_id, "ID") == b.text.replace(b_id, "ID"), (a.text, b.text)


def test_same_id_in_two_tenants_never_collides(tenants):
    base = tenants["url"]
    acme_echo, beta_echo = tenants["agents"]["acme.echo"], tenants["agents"]["beta.echo"]
    # Each tenant's echo is its own agent, at its own gateway address.
    for slug in ("acme", "beta"):
        r = httpx.post(f"{base}/a2a/t/{slug}/echo", headers=_auth(tenants[slug]), json=RPC)
        assert r.status_code == 200, r.text
        assert r.json()["result"]["parts"][0]["text"] == "echo: hi"
    assert (_posts(acme_echo), _posts(beta_echo)) == (1, 1)
    # The default tenant has no echo: /a2a/echo is not either of them.
    admin = _client("default", ["admin"])
    r = httpx.post(f"{base}/a2a/echo", headers=_auth(admin), json=RPC)
    assert r.json()["error"]["data"]["kind"] == "agent_not_found", r.text
    # The served card points at the tenant's address, and says which tenant in its gRPC-free
    # interfaces' URLs.
    card = httpx.get(f"{base}/a2a/t/acme/echo/.well-known/agent-card.json",
                     headers=_auth(tenants["acme"])).json()
    urls = [i["url"] for i in card.get("supportedInterfaces", [])] + [card.get("url", "")]
    assert all(u.startswith(f"{base}/a2a/t/acme/echo/") for u in urls if u), urls
    # The routing keys are qualified: the registry's rows keep the bare id in their tenant.
    assert sorted(a.key for a in Agent.objects.filter(agent_id="echo")) == \
        ["acme.echo", "beta.echo"]
    # A qualified id is addressed under /a2a/t/ only.
    r = httpx.post(f"{base}/a2a/beta.echo", headers=_auth(admin), json=RPC)
    assert "invalid agent id" in r.text and _posts(beta_echo) == 1
    # The platform admin (the default tenant's) sees both, each with its tenant.
    listed = httpx.get(f"{base}/api/v1/agents", headers=_auth(admin)).json()["results"]
    assert sorted((a["tenant"], a["agent_id"]) for a in listed) == \
        [("acme", "echo"), ("beta", "echo"), ("beta", "secret")]


def test_a_tenant_refused_on_every_surface_learns_nothing(tenants):
    base, acme = tenants["url"], _auth(tenants["acme"])
    beta_echo = tenants["agents"]["beta.echo"]
    # Lists: only acme's own agent, nothing of beta's anywhere in the answers.
    listed = httpx.get(f"{base}/api/v1/agents", headers=acme)
    assert [(a["tenant"], a["agent_id"]) for a in listed.json()["results"]] == \
        [("acme", "echo")]
    kubemq = httpx.get(f"{base}/agents", headers=acme)
    assert [a["agent_id"] for a in kubemq.json()] == ["echo"]
    searched = httpx.get(f"{base}/api/v1/agents", params={"q": "echo"}, headers=acme)
    ard = httpx.post(f"{base}/ard/v1/search", headers=acme,
                     json={"query": {"text": "echo messages back"}, "pageSize": 50})
    ard_list = httpx.get(f"{base}/ard/v1/agents", headers=acme)
    catalog = httpx.get(f"{base}/.well-known/ai-catalog.json", headers=acme)
    for answer in (listed, kubemq, searched, ard, ard_list, catalog):
        assert answer.status_code == 200, answer.text
        assert "beta" not in answer.text and "secret" not in answer.text, answer.text
        assert str(beta_echo.port) not in answer.text
    assert len(ard.json()["results"]) == 1 and "/a2a/t/acme/echo/" in ard.text
    # One agent, one answer, whatever is asked of beta's: the unknown agent's refusal.
    ghost, real = "beta.nothing", "beta.echo"
    pairs = {
        "get": lambda i: httpx.get(f"{base}/api/v1/agents/{i}", headers=acme),
        "card": lambda i: httpx.get(f"{base}/api/v1/agents/{i}/card", headers=acme),
        "patch": lambda i: httpx.patch(f"{base}/api/v1/agents/{i}", headers=acme,
                                       json={"ttl_seconds": 60}),
        "delete": lambda i: httpx.delete(f"{base}/api/v1/agents/{i}", headers=acme),
        "heartbeat": lambda i: httpx.post(f"{base}/api/v1/agents/{i}/heartbeat",
                                          headers=acme),
        "kubemq get": lambda i: httpx.get(f"{base}/agents/{i}", headers=acme),
        "kubemq heartbeat": lambda i: httpx.post(f"{base}/agents/heartbeat", headers=acme,
                                                 json={"agent_id": i}),
        "kubemq deregister": lambda i: httpx.post(f"{base}/agents/deregister", headers=acme,
                                                  json={"agent_id": i}),
    }
    for what, ask in pairs.items():
        _same_refusal(ask(real), ask(ghost), real, ghost)
        assert ask(real).status_code in (400, 404), what
    gateway = {
        "call": lambda name: httpx.post(f"{base}/a2a/t/beta/{name}", headers=acme, json=RPC),
        "rest": lambda name: httpx.post(f"{base}/a2a/t/beta/{name}/message:send", headers={
            **acme, "A2A-Version": "1.0"}, json={"message": {
                "role": "ROLE_USER", "messageId": "m2", "parts": [{"text": "hi"}]}}),
        "card": lambda name: httpx.get(
            f"{base}/a2a/t/beta/{name}/.well-known/agent-card.json", headers=acme),
    }
    for what, ask in gateway.items():
        _same_refusal(ask("echo"), ask("nothing"), "beta.echo", "beta.nothing")
        assert "agent_not_found" in ask("echo").text, what
    # An agent with credential passthrough (its callers name themselves in
    # X-Gateway-Authorization): whichever header a caller uses, the unknown agent's answer.
    r = httpx.patch(f"{base}/api/v1/agents/secret", headers=_auth(tenants["beta"]),
                    json={"credential_passthrough": True})
    assert r.status_code == 200, r.text
    token = acme["Authorization"]
    for sent in ({"Authorization": token}, {"X-Gateway-Authorization": token},
                 {"Authorization": "Bearer agents-own", "X-Gateway-Authorization": token},
                 {"Authorization": "Bearer not-ours"}, {}):
        def ask(name, sent=sent):
            return httpx.post(f"{base}/a2a/t/beta/{name}", headers=sent, json=RPC)
        _same_refusal(ask("secret"), ask("nothing"), "beta.secret", "beta.nothing")
    assert _posts(tenants["agents"]["beta.secret"]) == 0
    # Beta's agent never heard of any of it, and is still registered.
    assert _posts(beta_echo) == 0
    assert Agent.objects.filter(tenant_id="beta", agent_id="echo").exists()
    # A bare id is the caller's own tenant's: acme manages its own echo, not beta's.
    assert httpx.post(f"{base}/api/v1/agents/echo/heartbeat", headers=acme).status_code == 200
    # Registering into another tenant is refused without a word about its agents.
    r = httpx.post(f"{base}/api/v1/agents", headers=acme, json={
        "agent_id": "beta.echo", "url": beta_echo.url, "card": beta_echo.card_document})
    assert r.status_code == 403 and "echo" not in r.json()["error"]


def test_publishing_and_sharing(tenants):
    base = tenants["url"]
    acme, beta, gamma = (_auth(tenants[t]) for t in ("acme", "beta", "gamma"))
    beta_echo, secret = tenants["agents"]["beta.echo"], tenants["agents"]["beta.secret"]
    r = httpx.patch(f"{base}/api/v1/agents/echo", headers=beta, json={"visibility": "public"})
    assert r.status_code == 200 and r.json()["visibility"] == "public", r.text
    r = httpx.patch(f"{base}/api/v1/agents/secret", headers=beta,
                    json={"visibility": "shared", "shared_with": ["acme"]})
    assert r.status_code == 200 and r.json()["shared_with"] == ["acme"], r.text
    r = httpx.patch(f"{base}/api/v1/agents/secret", headers=beta,
                    json={"shared_with": ["no-such-tenant"]})
    assert r.status_code == 400 and "unknown tenant" in r.text

    # A published agent: every tenant calls it (through the gateway, routing in memory) and
    # sees it, with the gateway's address only; none manages it.
    for who in (acme, gamma):
        r = httpx.post(f"{base}/a2a/t/beta/echo", headers=who, json=RPC)
        assert r.status_code == 200, r.text
        seen = httpx.get(f"{base}/api/v1/agents/beta.echo", headers=who).json()
        assert seen["url"] == f"{base}/a2a/t/beta/echo/" and seen["owner"] is None
        assert httpx.delete(f"{base}/api/v1/agents/beta.echo", headers=who).status_code == 404
    assert _posts(beta_echo) == 2
    # A shared agent: acme reaches it, gamma does not (nor learns that it exists).
    assert httpx.post(f"{base}/a2a/t/beta/secret", headers=acme, json=RPC).status_code == 200
    shown = httpx.get(f"{base}/api/v1/agents/beta.secret", headers=acme).json()
    assert shown["shared_with"] == []  # who else it is shared with is beta's business
    refused = httpx.post(f"{base}/a2a/t/beta/secret", headers=gamma, json=RPC)
    unknown = httpx.post(f"{base}/a2a/t/beta/nothing", headers=gamma, json=RPC)
    _same_refusal(refused, unknown, "beta.secret", "beta.nothing")
    assert _posts(secret) == 1
    listed = {a["agent_id"] for a in httpx.get(f"{base}/api/v1/agents",
                                                headers=gamma).json()["results"]}
    assert listed == {"echo"}  # beta's published echo only
    # MCP: the tools a caller may call, qualified outside its own tenant... and for gamma,
    # only the published one.
    tools = {t.name for t in run(base, tenants["gamma"], all_tools)}
    assert tools == {"beta.echo", "get_task"}
    tools = {t.name for t in run(base, tenants["acme"], all_tools)}
    assert tools == {"acme.echo", "beta.echo", "beta.secret", "get_task"}


def test_tenant_admin_is_admin_of_its_tenant_only(tenants):
    base = tenants["url"]
    acme_admin = _auth(_client("acme", ["admin"]))
    listed = httpx.get(f"{base}/api/v1/agents", headers=acme_admin).json()["results"]
    assert [(a["tenant"], a["agent_id"]) for a in listed] == [("acme", "echo")]
    assert listed[0]["url"] == tenants["agents"]["acme.echo"].url  # its tenant's internals
    for path in ("/api/v1/agents/beta.echo", "/agents/beta.echo"):
        assert httpx.get(f"{base}{path}", headers=acme_admin).status_code == 404
    assert httpx.delete(f"{base}/api/v1/agents/beta.echo",
                        headers=acme_admin).status_code == 404
    assert httpx.get(f"{base}/metrics", headers=acme_admin).status_code in (200, 401)
    # The platform admin manages any tenant's agent by its qualified id.
    platform = _auth(_client("default", ["admin"]))
    assert httpx.delete(f"{base}/api/v1/agents/beta.secret",
                        headers=platform).status_code == 204
    assert not Agent.objects.filter(tenant_id="beta", agent_id="secret").exists()


@pytest.fixture
def idp(settings):
    provider = IdentityProvider(SigningKey("rsa-t"))
    settings.A2A_JWT_ISSUERS = [{"issuer": provider.url, "audience": AUDIENCE,
                                 "name": "tenant-idp", "claims": {"tenant": "org"}}]
    yield provider
    provider.stop()


def test_jwt_callers_belong_to_their_tenant_claim(tenants, idp):
    base = tenants["url"]
    acme = _auth(idp.token(scope="a2a.call", org="acme"))
    assert httpx.post(f"{base}/a2a/t/acme/echo", headers=acme, json=RPC).status_code == 200
    listed = httpx.get(f"{base}/api/v1/agents", headers=acme).json()["results"]
    assert [(a["tenant"], a["agent_id"]) for a in listed] == [("acme", "echo")]
    refused = httpx.post(f"{base}/a2a/t/beta/echo", headers=acme, json=RPC)
    unknown = httpx.post(f"{base}/a2a/t/beta/nothing", headers=acme, json=RPC)
    _same_refusal(refused, unknown, "beta.echo", "beta.nothing")
    _same_refusal(httpx.get(f"{base}/api/v1/agents/beta.echo", headers=acme),
                  httpx.get(f"{base}/api/v1/agents/beta.nothing", headers=acme),
                  "beta.echo", "beta.nothing")
    assert _posts(tenants["agents"]["beta.echo"]) == 0
    # A tenant this platform does not have, or no tenant slug at all: 401 naming why.
    for org, why in (("nowhere", "unknown tenant 'nowhere'"), ("Not A Slug", "names no valid")):
        token = _auth(idp.token(scope="a2a.call", org=org))
        for r in (httpx.post(f"{base}/a2a/t/acme/echo", headers=token, json=RPC),
                  httpx.get(f"{base}/api/v1/agents", headers=token)):
            assert r.status_code == 401 and why in r.text, r.text
    # No claim: the issuer's tenant (the default one here), which acme's agent is not in.
    plain = _auth(idp.token(scope="a2a.call"))
    r = httpx.post(f"{base}/a2a/t/acme/echo", headers=plain, json=RPC)
    assert r.json()["error"]["data"]["kind"] == "agent_not_found", r.text


@pytest.fixture
def grpc_listener(settings):
    """The node's gRPC listener on a free port (asked for before the live server starts)."""
    settings.A2A_GRPC_PORT = 0


async def test_grpc_names_another_tenants_agent_by_its_qualified_id(grpc_listener, tenants):
    import grpc
    from a2a.helpers import get_message_text
    from a2a.types import a2a_pb2
    from a2a.types import a2a_pb2_grpc as grpc10

    from core import lifecycle as node_config
    from tests.a2a_agents import user_message
    from tests.gateway.test_grpc_binding import on_node, status_of

    base, acme = tenants["url"], tenants["acme"]
    address = f"127.0.0.1:{node_config.grpc_port()}"
    async with httpx.AsyncClient() as http:
        card = (await http.get(f"{base}/a2a/t/acme/echo/.well-known/agent-card.json",
                               headers=_auth(acme))).json()
    grpc_interfaces = [i for i in card["supportedInterfaces"] if i["protocolBinding"] == "GRPC"]
    assert [i["tenant"] for i in grpc_interfaces] == ["acme.echo"]
    metadata = (("authorization", f"Bearer {acme}"),)

    async def calls():
        async with grpc.aio.insecure_channel(address) as channel:
            stub = grpc10.A2AServiceStub(channel)
            reply = await stub.SendMessage(a2a_pb2.SendMessageRequest(
                tenant="acme.echo", message=user_message("hi").message), metadata=metadata)
            refusals = []
            for tenant in ("beta.echo", "beta.nothing"):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.SendMessage(a2a_pb2.SendMessageRequest(
                        tenant=tenant, message=user_message("hi").message), metadata=metadata)
                code, executed, info = status_of(refused.value)
                refusals.append((code, executed, info["kind"],
                                 refused.value.details().replace(tenant, "ID")))
            return reply, refusals

    reply, refusals = await on_node(calls())
    assert get_message_text(reply.message) == "echo: hi"
    assert refusals[0] == refusals[1]
    assert refusals[0][:3] == (grpc.StatusCode.NOT_FOUND, "false", "agent_not_found")
    assert _posts(tenants["agents"]["beta.echo"]) == 0


def test_the_consoles_test_message_reaches_any_tenants_agent(tenants):
    """The agent page's *Test message* (sent by the node serving the console) calls as the
    console's caller of the agent's own tenant: a tenant admin's and a superuser's test message
    reach that tenant's private agent."""
    import re

    from django.contrib.auth.models import Group, Permission, User
    from django.test import Client

    from registry.staff import tenant_group_name

    group = Group.objects.create(name=tenant_group_name("acme"))
    group.permissions.set(Permission.objects.filter(content_type__app_label="registry"))
    ann = User.objects.create_user("ann", password="x", is_staff=True)
    ann.groups.add(group)
    root = User.objects.create_superuser("root", password="x")
    agent = Agent.objects.get(tenant_id="acme", agent_id="echo")
    page_url = f"{tenants['url']}/admin/registry/agent/{agent.pk}/test-message/"
    for user, text in ((ann, "from ann"), (root, "from root")):
        login = Client()
        login.force_login(user)
        with httpx.Client(cookies={k: m.value for k, m in login.cookies.items()},
                          timeout=30) as console:
            form = console.get(page_url)
            assert form.status_code == 200, form.text[-2000:]
            csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)[1]
            page = console.post(page_url, data={"text": text, "csrfmiddlewaretoken": csrf},
                                headers={"Referer": page_url})
        assert page.status_code == 200
        assert f"echo: {text}" in page.text, page.text[-3000:]
    assert _posts(tenants["agents"]["acme.echo"]) == 2
