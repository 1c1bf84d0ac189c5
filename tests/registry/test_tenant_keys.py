"""Tenants (docs/tenants.md) in the registry's own terms: routing keys, the caller's reach,
and everything keyed by agent id -- routes, events, tombstones, expiry, batched writes --
keeping two tenants' agents of one id apart."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gateway.handler import tenant_scope
from registry import quotas, selectors, services
from registry.events import AgentRoute
from registry.ids import (
    DEFAULT_TENANT,
    agent_key,
    agent_name_error,
    gateway_path,
    key_of_gateway_path,
    split_agent_key,
)
from registry.models import Agent, ApiClient, Tenant
from registry.permissions import Actor, PermissionDenied
from registry.services.agents import registration
from tests.registry.cards import card_03


def test_keys_paths_and_names():
    assert agent_key(DEFAULT_TENANT, "echo") == "echo"  # today's keys are unchanged
    assert agent_key("acme", "echo") == "acme.echo"
    assert split_agent_key("acme.echo") == ("acme", "echo")
    assert split_agent_key("echo") == (DEFAULT_TENANT, "echo")
    assert gateway_path("echo") == "/a2a/echo/"
    assert gateway_path("acme.echo") == "/a2a/t/acme/echo/"
    for key in ("echo", "acme.echo"):
        assert key_of_gateway_path(gateway_path(key)) == key
        assert key_of_gateway_path("https://gw.example" + gateway_path(key)) == key
    assert agent_name_error("acme.echo") is None
    assert "invalid tenant" in agent_name_error("Acme.echo")
    assert "invalid agent_id" in agent_name_error("acme.Echo")


def test_tenant_paths_become_routing_keys_in_the_gateway():
    scope = {"path": "/a2a/t/acme/echo/message:send", "raw_path": b"/a2a/t/acme/echo/message:send"}
    qualified = tenant_scope(scope)
    assert qualified is not None
    assert (qualified["path"], qualified["raw_path"]) == \
        ("/a2a/acme.echo/message:send", b"/a2a/acme.echo/message:send")
    assert scope["path"] == "/a2a/t/acme/echo/message:send"  # the caller's scope untouched
    assert tenant_scope({"path": "/a2a/t/acme/echo"})["path"] == "/a2a/acme.echo"
    assert tenant_scope({"path": "/a2a/t/NOT/echo"}) is None
    assert tenant_scope({"path": "/a2a/t/acme/x.y"}) is None


def _route(tenant: str, visibility: str = "private", shared: tuple[str, ...] = ()) -> AgentRoute:
    return AgentRoute(agent_id=agent_key(tenant, "echo"), endpoint="http://a/", node_id="n",
                      max_concurrency=1, expires_at=0.0, owner_client_id=None, card_sha256="",
                      tenant=tenant, visibility=visibility, shared_with=shared)


def test_a_callers_reach():
    caller = Actor(client_id="c", scopes=frozenset({"call"}), tenant="acme")
    assert caller.may_call("acme.echo", _route("acme"))
    assert not caller.may_call("beta.echo", _route("beta"))
    assert caller.may_call("beta.echo", _route("beta", "public"))
    assert caller.may_call("beta.echo", _route("beta", "shared", ("acme",)))
    assert not caller.may_call("beta.echo", _route("beta", "shared", ("gamma",)))
    assert not caller.may_call("echo", _route(DEFAULT_TENANT))  # the default tenant's too
    assert caller.locate("echo") == ("acme", "echo")
    assert caller.locate("beta.echo") == ("beta", "echo")
    # An allowed list names the caller's own agents bare, others' qualified.
    listed = Actor(client_id="c", scopes=frozenset({"call"}), tenant="acme",
                   allowed_agents=frozenset({"echo", "beta.echo"}))
    assert listed.allowed_keys == {"acme.echo", "beta.echo"}
    assert listed.may_call("beta.echo", _route("beta", "public"))
    assert not listed.may_call("acme.other", _route("acme"))
    # A tenant's admin is admin of its tenant; the default tenant's admin of every tenant.
    tenant_admin = Actor(client_id="a", scopes=frozenset({"admin"}), tenant="acme")
    platform = Actor(client_id="p", scopes=frozenset({"admin"}))
    assert not tenant_admin.is_platform_admin and platform.is_platform_admin
    assert not tenant_admin.may_call("beta.echo", _route("beta"))
    assert platform.may_call("beta.echo", _route("beta"))


@pytest.fixture
def two_tenants(transactional_db):
    for slug in ("acme", "beta"):
        services.tenant_create(slug=slug)
    actors = {}
    for slug in ("acme", "beta"):
        _, token = services.api_client_create(name=f"{slug}-reg", scopes=["register", "call"],
                                              tenant=slug)
        actors[slug] = selectors.actor_from_token(token=token)
        assert actors[slug].tenant == slug
    return actors


def _register(actor: Actor, agent_id: str = "echo") -> Agent:
    agent, created = services.agent_register(actor=actor, agent_id=agent_id, card=card_03())
    assert created
    return agent


def test_the_default_tenant_holds_what_existed(db):
    assert Tenant.objects.filter(slug=DEFAULT_TENANT).exists()
    client, _ = services.api_client_create(name="plain", scopes=["call"])
    assert ApiClient.objects.get(pk=client.pk).tenant_id == DEFAULT_TENANT
    with pytest.raises(services.InvalidInput, match="unknown tenant"):
        services.api_client_create(name="lost", scopes=["call"], tenant="nowhere")


def test_one_id_in_two_tenants_keeps_apart_everywhere(two_tenants, recorded_events):
    acme, beta = _register(two_tenants["acme"]), _register(two_tenants["beta"])
    assert (acme.key, beta.key) == ("acme.echo", "beta.echo")
    routes = {r.agent_id: r for r in selectors.agent_routes()}
    assert set(routes) == {"acme.echo", "beta.echo"}
    assert (routes["acme.echo"].tenant, routes["beta.echo"].tenant) == ("acme", "beta")
    assert [e.agent_id for e in recorded_events] == ["acme.echo", "beta.echo"]
    # Heartbeats renew the caller's own tenant's agent only.
    [renewed, foreign] = services.agents_heartbeat(
        beats=[(two_tenants["acme"], "echo"), (two_tenants["acme"], "beta.echo")])
    assert renewed is not None and foreign is None
    with pytest.raises(services.AgentNotFound):
        services.agent_heartbeat(actor=two_tenants["acme"], agent_id="beta.echo")
    with pytest.raises(services.AgentNotFound):
        services.agent_deregister(actor=two_tenants["acme"], agent_id="beta.echo")
    # A deregistration's tombstone and event name the tenant's key, not the other's.
    since = timezone.now() - timedelta(seconds=1)
    services.agent_deregister(actor=two_tenants["beta"], agent_id="echo")
    assert recorded_events[-1].agent_id == "beta.echo"
    changes = selectors.agent_route_changes(since=since)
    assert "beta.echo" in changes.gone and "acme.echo" not in changes.gone
    assert Agent.objects.filter(tenant_id="acme", agent_id="echo").exists()
    # Expiry names keys too.
    Agent.objects.filter(pk=acme.pk).update(expires_at=timezone.now() - timedelta(seconds=5))
    assert services.agents_expire()["expired"] == 1
    assert recorded_events[-1].agent_id == "acme.echo"


def test_registrations_written_together_keep_tenants_apart(two_tenants):
    regs = [registration(actor=two_tenants[slug], agent_id="echo",
                         card=card_03(url=f"http://127.0.0.1:9/{slug}")) for slug in
            ("acme", "beta")]
    results = services.agents_register(regs)
    assert [r[1] for r in results] == [True, True], results
    assert sorted(Agent.objects.values_list("tenant_id", "agent_id")) == \
        [("acme", "echo"), ("beta", "echo")]
    # Each has its own first card version.
    for agent in Agent.objects.all():
        assert agent.card_versions.count() == 1


def test_registering_into_another_tenant(two_tenants):
    with pytest.raises(PermissionDenied, match="tenant beta"):
        registration(actor=two_tenants["acme"], agent_id="beta.echo",
                     card=card_03(url="http://127.0.0.1:9/"))
    platform = Actor(client_id="p", scopes=frozenset({"admin"}))
    agent, created = services.agent_register(actor=platform, agent_id="beta.made",
                                             card=card_03(url="http://127.0.0.1:9/"))
    assert created and agent.key == "beta.made"
    with pytest.raises(services.InvalidInput, match="unknown tenant"):
        services.agent_register(actor=platform, agent_id="gone.made",
                                card=card_03(url="http://127.0.0.1:9/"))


def test_tenant_quotas_name_themselves(two_tenants):
    Tenant.objects.filter(slug="acme").update(max_agents=1, max_card_bytes=4096)
    quotas.forget_tenant_limits()
    _register(two_tenants["acme"], "one")
    with pytest.raises(PermissionDenied, match=r"tenant acme may have at most 1 agents "
                                               r"\(max_agents\)"):
        _register(two_tenants["acme"], "two")
    # A renewal is no new agent; beta has no quota of its own.
    services.agent_register(actor=two_tenants["acme"], agent_id="one", card=card_03())
    _register(two_tenants["beta"], "two")
    big = card_03()
    big["description"] = "x" * 5000
    with pytest.raises(PermissionDenied, match=r"at most 4096 bytes \(max_card_bytes\)"):
        services.agent_register(actor=two_tenants["acme"], agent_id="one", card=big)
    with pytest.raises(PermissionDenied, match="max_card_bytes"):
        services.agent_update(actor=two_tenants["acme"], agent_id="one", card=big)
    # Written together, a limited tenant's registrations are still checked one by one.
    results = services.agents_register([
        registration(actor=two_tenants["acme"], agent_id=f"batch-{n}", card=card_03())
        for n in range(2)])
    assert all(isinstance(r, PermissionDenied) for r in results), results
    quotas.forget_tenant_limits()


def test_every_read_of_a_shared_agents_route_names_whom_it_is_shared_with(two_tenants):
    """The route a registration publishes, a full resync's and an incremental resync's agree.
    The gateway decides a shared agent's reach from its route, and the watchers (MCP's change
    notifications) compare routes: a resync that lost ``shared_with`` took the agent out of
    the named tenants' reach and announced a change each time."""
    since = timezone.now() - timedelta(seconds=1)
    secret = _register(two_tenants["beta"], "secret")
    _register(two_tenants["beta"], "plain")
    services.agent_update(actor=two_tenants["beta"], agent_id="secret", visibility="shared",
                          shared_with=["acme"])
    secret.refresh_from_db()
    published = selectors.agent_route(secret)
    full = {r.agent_id: r for r in selectors.agent_routes()}
    changed = {r.agent_id: r for r in selectors.agent_route_changes(since=since).routes}
    assert published.shared_with == ("acme",)
    assert full["beta.secret"] == published and changed["beta.secret"] == published
    assert full["beta.plain"].shared_with == () == changed["beta.plain"].shared_with
