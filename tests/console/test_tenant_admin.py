"""Admins per tenant in the console (docs/tenants.md, "Admins per tenant"), with Django's test
client: a staff user in the group ``tenant:acme`` sees and opens only acme's agents, clients,
audit rows and pushes (another tenant's pages are 404s), its dashboard counts acme's only, the
clients it creates are acme's; a superuser sees every tenant's and moves an agent; the agent
list's query count is flat in the number of tenants."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from console.models import AgentMinute, CallRecord, RegistryChange
from gateway.histogram import BUCKETS
from push.models import PushDelivery, RelayedConfig
from registry import services
from registry.models import Agent, ApiClient, Tenant
from registry.permissions import SYSTEM, Actor, PermissionDenied
from registry.selectors import agent_route_changes
from registry.staff import tenant_group_name
from tests.registry.cards import card_03

pytestmark = pytest.mark.django_db

ACME_PERMS = ("agent", "apiclient", "callrecord", "registrychange", "pushdelivery",
              "relayedconfig", "tenant", "node", "alert", "configuredagent", "sourcefeed",
              "need", "snapshot", "sessionpin")


def _tenant_admin(username: str, *tenants: str) -> User:
    user = User.objects.create_user(username, password="x", is_staff=True)
    perms = Permission.objects.filter(content_type__model__in=ACME_PERMS)
    for slug in tenants:
        group, _ = Group.objects.get_or_create(name=tenant_group_name(slug))
        group.permissions.set(perms)
        user.groups.add(group)
    return user


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _push(agent_id: str) -> PushDelivery:
    tenant = agent_id.partition(".")[0]
    cfg = RelayedConfig.objects.create(
        id=os.urandom(16).hex(), tenant_id=tenant, agent_id=agent_id, client_id="c",
        config_id="cfg",
        task_id=f"task-{agent_id}", url="https://hook.example/x", secret_sha256="0" * 64)
    return PushDelivery.objects.create(
        config=cfg, tenant_id=tenant, agent_id=agent_id, task_id=cfg.task_id, sequence=1,
        body=b"{}",
        idempotency_key=f"{cfg.pk}.1")


def _minute(agent_id: str, requests: int) -> None:
    hist = [0] * BUCKETS
    hist[20] = requests
    at = (timezone.now() - timedelta(minutes=1)).replace(second=0, microsecond=0)
    AgentMinute.objects.create(agent_id=agent_id, node_id="n1", minute=at, requests=requests,
                               histogram=hist, last_call_at=at, last_outcome="ok")


@pytest.fixture
def world():
    Tenant.objects.create(slug="acme", name="Acme")
    Tenant.objects.create(slug="beta", name="Beta")
    agents = {}
    for key in ("acme.alpha", "beta.bravo", "plain"):
        agents[key], _ = services.agent_register(actor=SYSTEM, agent_id=key, card=card_03(),
                                                 ttl_seconds=600)
    clients = {t: services.api_client_create(name=f"{t}-client", scopes=["call"], tenant=t)[0]
               for t in ("acme", "beta")}
    now = timezone.now()
    audit = {t: RegistryChange.objects.create(at=now, action="agent.registered", actor="x",
                                              tenant=t, agent_id=k)
             for t, k in (("acme", "acme.alpha"), ("beta", "beta.bravo"))}
    calls = {t: CallRecord.objects.create(at=now, caller="c", agent_id=k, tenant=t,
                                          method="message/send", outcome="ok",
                                          executed=True, latency_ms=1.0, node_id="n1")
             for t, k in (("acme", "acme.alpha"), ("beta", "beta.bravo"))}
    pushes = {t: _push(k) for t, k in (("acme", "acme.alpha"), ("beta", "beta.bravo"))}
    _minute("acme.alpha", 7)
    _minute("beta.bravo", 100)
    _minute("plain", 1000)
    return {"agents": agents, "clients": clients, "audit": audit, "calls": calls,
            "pushes": pushes}


def _change(model: str, pk) -> str:
    return reverse(f"admin:{model}_change", args=[pk])


def test_a_tenant_admin_sees_and_opens_only_its_tenants_rows(world):
    ann = _client(_tenant_admin("ann", "acme"))
    pages = {
        "registry_agent": ("alpha", "bravo", world["agents"]),
        "registry_apiclient": ("acme-client", "beta-client", world["clients"]),
        "console_registrychange": ("acme.alpha", "beta.bravo", world["audit"]),
        "console_callrecord": ("acme.alpha", "beta.bravo", world["calls"]),
        "push_pushdelivery": ("task-acme.alpha", "task-beta.bravo", world["pushes"]),
    }
    for model, (own, other, rows) in pages.items():
        listing = ann.get(reverse(f"admin:{model}_changelist"))
        assert listing.status_code == 200, model
        html = listing.content.decode()
        assert own in html and other not in html, model
        if model == "registry_agent":
            own_row, other_row = rows["acme.alpha"], rows["beta.bravo"]
            assert "plain" not in html  # the default tenant's is another tenant's too
        else:
            own_row, other_row = rows["acme"], rows["beta"]
        assert ann.get(_change(model, own_row.pk)).status_code == 200, model
        assert ann.get(_change(model, other_row.pk)).status_code == 404, model
    config = world["pushes"]["beta"].config
    assert ann.get(_change("push_relayedconfig", config.pk)).status_code == 404
    # The agent's own pages and its routing-key address.
    bravo = world["agents"]["beta.bravo"]
    for name in ("registry_agent_card_diff", "registry_agent_test_message"):
        assert ann.get(reverse(f"admin:{name}", args=[bravo.pk])).status_code == 404
    assert ann.get(reverse("admin:registry_agent_by_id", args=["beta.bravo"])).status_code == 404
    # The platform's pages are absent, and no filter lists the tenants.
    assert ann.get(reverse("admin:registry_node_changelist")).status_code == 404
    index = ann.get(reverse("admin:index")).content.decode()
    assert 'id="console-nodes"' not in index and 'id="console-discovery"' not in index
    clients = ann.get(reverse("admin:registry_apiclient_changelist")).content.decode()
    assert "beta" not in clients


def test_a_tenant_admins_dashboard_counts_its_tenant_only(world):
    ann = _client(_tenant_admin("ann", "acme"))
    html = ann.get(reverse("admin:index")).content.decode()
    assert 'id="tile-active"><span class="value">1</span>' in html
    assert 'id="tile-requests"><span class="value">7</span>' in html
    root = _client(User.objects.create_superuser("root", password="x"))
    html = root.get(reverse("admin:index")).content.decode()
    assert 'id="tile-active"><span class="value">3</span>' in html
    assert 'id="tile-requests"><span class="value">1107</span>' in html


def test_a_tenant_admins_new_client_is_its_tenants(world):
    ann = _client(_tenant_admin("ann", "acme"))
    form = ann.get(reverse("admin:registry_apiclient_add")).content.decode()
    assert 'name="tenant"' not in form  # read-only for a tenant admin
    response = ann.post(reverse("admin:registry_apiclient_add"), {
        "name": "made-by-ann", "scopes": ["call"], "allowed_agents": "", "tenant": "beta"})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert ApiClient.objects.get(client_id="made-by-ann").tenant_id == "acme"


def test_a_user_in_two_tenants_groups_is_refused(world):
    both = _client(_tenant_admin("both", "acme", "beta"))
    response = both.get(reverse("admin:registry_agent_changelist"))
    assert response.status_code == 302 and "login" in response["Location"]


def test_a_superuser_sees_every_tenant(world):
    root = _client(User.objects.create_superuser("root", password="x"))
    html = root.get(reverse("admin:registry_agent_changelist")).content.decode()
    assert "alpha" in html and "bravo" in html and "plain" in html
    for row in world["agents"].values():
        assert root.get(_change("registry_agent", row.pk)).status_code == 200
    assert root.get(reverse("admin:registry_tenant_changelist")).status_code == 200


def test_the_agent_list_query_count_is_flat_in_tenants(db):
    ann = _client(_tenant_admin("ann", "acme"))

    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            response = ann.get(reverse("admin:registry_agent_changelist"))
            assert response.status_code == 200
        return len(ctx.captured_queries)

    Tenant.objects.create(slug="acme", name="Acme")
    services.agent_register(actor=SYSTEM, agent_id="acme.a0", card=card_03())
    small = count()
    for i in range(1, 20):
        Tenant.objects.create(slug=f"t{i}", name=f"T{i}")
        services.agent_register(actor=SYSTEM, agent_id=f"t{i}.other", card=card_03())
        services.agent_register(actor=SYSTEM, agent_id=f"acme.a{i}", card=card_03())
        _minute(f"acme.a{i}", i)
    assert count() == small
    assert Agent.objects.count() == 39


def test_a_superusers_lists_query_count_is_flat_in_tenants(db):
    """The platform admin's agent list and tenants page (quotas, use, refusals of every
    tenant) cost as many queries with 21 tenants as with 2."""
    root = _client(User.objects.create_superuser("root", password="x"))
    pages = [reverse("admin:registry_agent_changelist"),
             reverse("admin:registry_tenant_changelist"),
             reverse("admin:registry_apiclient_changelist")]

    def count() -> list[int]:
        counts = []
        for page in pages:
            with CaptureQueriesContext(connection) as ctx:
                assert root.get(page).status_code == 200
            counts.append(len(ctx.captured_queries))
        return counts

    def tenant(slug: str) -> None:
        Tenant.objects.create(slug=slug, name=slug.upper(), max_agents=50,
                              max_calls_per_second=10, max_concurrent_streams=5)
        services.agent_register(actor=SYSTEM, agent_id=f"{slug}.agent", card=card_03())
        services.api_client_create(name=f"{slug}-client", scopes=["call"], tenant=slug)

    tenant("t0")
    small = count()
    for i in range(1, 20):
        tenant(f"t{i}")
    assert count() == small
    assert Tenant.objects.count() == 21


def test_a_tenant_admins_session_on_the_api_is_its_tenants(world):
    ann = _client(_tenant_admin("ann", "acme"))
    listed = ann.get("/api/v1/agents").json()
    rows = listed.get("results", listed) if isinstance(listed, dict) else listed
    assert [(a["tenant"], a["agent_id"]) for a in rows] == [("acme", "alpha")]
    assert ann.get("/api/v1/agents/beta.bravo").status_code == 404


def test_a_superuser_chooses_a_new_clients_tenant(world):
    root = _client(User.objects.create_superuser("root", password="x"))
    response = root.post(reverse("admin:registry_apiclient_add"), {
        "name": "for-beta", "scopes": ["call"], "allowed_agents": "", "tenant": "beta"})
    assert response.status_code == 302
    assert ApiClient.objects.get(client_id="for-beta").tenant_id == "beta"


def _change_post(agent: Agent, **fields: str) -> dict[str, str]:
    version = agent.card_versions.get()
    return {
        "ttl_seconds": str(agent.ttl_seconds), "max_concurrency": str(agent.max_concurrency),
        "card_versions-TOTAL_FORMS": "1", "card_versions-INITIAL_FORMS": "1",
        "card_versions-MIN_NUM_FORMS": "0", "card_versions-MAX_NUM_FORMS": "1000",
        "card_versions-0-id": str(version.pk), "card_versions-0-agent": str(agent.pk),
        **fields,
    }


def test_a_superuser_moves_an_agent_and_a_tenant_admin_cannot(world):
    bravo, alpha = world["agents"]["beta.bravo"], world["agents"]["acme.alpha"]
    ann = _client(_tenant_admin("ann", "acme"))
    assert 'name="tenant"' not in ann.get(_change("registry_agent", alpha.pk)).content.decode()
    r = ann.post(_change("registry_agent", alpha.pk), _change_post(alpha, tenant="beta"))
    assert r.status_code == 302
    assert Agent.objects.get(pk=alpha.pk).tenant_id == "acme"

    root = _client(User.objects.create_superuser("root", password="x"))
    assert 'name="tenant"' in root.get(_change("registry_agent", bravo.pk)).content.decode()
    r = root.post(_change("registry_agent", bravo.pk), _change_post(bravo, tenant="acme"))
    assert r.status_code == 302, r.content.decode()[:3000]
    moved = Agent.objects.get(pk=bravo.pk)
    assert (moved.tenant_id, moved.key, moved.owner_id) == ("acme", "acme.bravo", None)
    assert ann.get(_change("registry_agent", bravo.pk)).status_code == 200
    assert "bravo" in ann.get(reverse("admin:registry_agent_changelist")).content.decode()

    # An id the target tenant has already: refused, nothing moves.
    services.agent_register(actor=SYSTEM, agent_id="beta.alpha", card=card_03())
    r = root.post(_change("registry_agent", alpha.pk), _change_post(alpha, tenant="beta"),
                  follow=True)
    assert "tenant beta has an agent &#x27;alpha&#x27; already" in r.content.decode()
    assert Agent.objects.get(pk=alpha.pk).tenant_id == "acme"


def test_a_move_deregisters_the_old_key_and_registers_the_new(
        world, recorded_events, django_capture_on_commit_callbacks):
    since = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        services.agent_move_tenant(actor=SYSTEM, agent_id="beta.bravo", tenant="acme")
    assert [(e.kind, e.agent_id) for e in recorded_events] == [
        ("deregistered", "beta.bravo"), ("registered", "acme.bravo")]
    assert recorded_events[1].route is not None
    assert recorded_events[1].route.tenant == "acme"
    changes = agent_route_changes(since=since)
    assert "beta.bravo" in changes.gone
    assert "acme.bravo" in {route.agent_id for route in changes.routes}
    acme_admin = Actor(client_id="acme-admin", scopes=frozenset({"admin"}), tenant="acme")
    with pytest.raises(PermissionDenied, match="only a platform admin"):
        services.agent_move_tenant(actor=acme_admin, agent_id="acme.bravo", tenant="beta")


def test_the_tenants_page_shows_quotas_and_use(world):
    """A platform admin sees every tenant's quotas, its use and refusals, and edits them; a
    tenant admin sees its own tenant's, read-only, and nothing of another tenant."""
    Tenant.objects.filter(slug="acme").update(max_calls_per_second=5, max_concurrent_streams=2,
                                              max_registrations_per_minute=30)
    root = User.objects.create_superuser("root", password="x")
    listing = _client(root).get(reverse("admin:registry_tenant_changelist")).content.decode()
    for shown in ("calls/s: 5", "streams: 2", "registrations/min: 30", "agents: 1",
                  "registrations in the window: 0", "beta"):
        assert shown in listing, shown
    # Calls and streams: the cluster's in distributed mode (the nodes' reports), else this
    # node's, said so.
    assert ("open streams: " if settings.REDIS_URL else "open streams (this node): 0") in listing
    assert 'name="max_calls_per_second"' in _client(root).get(
        _change("registry_tenant", "acme")).content.decode()
    ann = _client(_tenant_admin("ann", "acme"))
    listing = ann.get(reverse("admin:registry_tenant_changelist")).content.decode()
    assert "calls/s: 5" in listing and "beta" not in listing
    page = ann.get(_change("registry_tenant", "acme"))
    assert page.status_code == 200
    html = page.content.decode()
    assert "Calls per second" in html or "calls per second" in html
    assert 'name="max_calls_per_second"' not in html  # read-only
    assert ann.post(_change("registry_tenant", "acme"),
                    {"name": "Mine", "max_calls_per_second": ""}).status_code == 403
    assert Tenant.objects.get(slug="acme").max_calls_per_second == 5
    assert ann.get(_change("registry_tenant", "beta")).status_code == 404
    assert ann.get(reverse("admin:registry_tenant_add")).status_code == 403


def test_a_tenant_admin_edits_its_tenants_discovery_rows(world):
    from discovery.models import ConfiguredAgent, Snapshot

    for tenant in ("acme", "beta"):
        ConfiguredAgent.objects.create(tenant_id=tenant, local_name=f"{tenant}_agent",
                                       url=f"https://{tenant}.example")
        Snapshot.objects.create(tenant_id=tenant, version=1, digest=f"{tenant}-digest")
    ann = _client(_tenant_admin("ann", "acme"))
    html = ann.get(reverse("admin:discovery_configuredagent_changelist")).content.decode()
    assert "acme_agent" in html and "beta_agent" not in html
    beta_row = ConfiguredAgent.objects.get(tenant_id="beta")
    assert ann.get(_change("discovery_configuredagent", beta_row.pk)).status_code == 404
    form = ann.get(reverse("admin:discovery_configuredagent_add")).content.decode()
    assert 'name="tenant"' in form and "disabled" in form and "beta" not in form
    # A local name another tenant uses is free in this one; the tenant is acme's whatever the
    # form says.
    response = ann.post(reverse("admin:discovery_configuredagent_add"), {
        "tenant": "beta", "kind": "static", "local_name": "beta_agent",
        "url": "https://acme-two.example", "description": "", "enabled": "on",
        "origin": "admin"})
    assert response.status_code == 302, response.content.decode()[:3000]
    assert ConfiguredAgent.objects.get(url="https://acme-two.example").tenant_id == "acme"
    again = ann.post(reverse("admin:discovery_configuredagent_add"), {
        "kind": "static", "local_name": "beta_agent", "url": "https://x.example",
        "description": "", "enabled": "on", "origin": "admin"})
    assert again.status_code == 200 and "already exists" in again.content.decode()
    snapshots = ann.get(reverse("admin:discovery_snapshot_changelist")).content.decode()
    assert "acme-digest" in snapshots and "beta-digest" not in snapshots
    beta_snap = Snapshot.objects.get(tenant_id="beta")
    assert ann.get(_change("discovery_snapshot", beta_snap.pk)).status_code == 404
    index = ann.get(reverse("admin:index")).content.decode()
    assert reverse("admin:discovery_configuredagent_changelist") in index
    for name in ("discovery_allowedhost_changelist", "discovery_cyclerun_changelist",
                 "discovery_capabilitytag_changelist"):
        assert ann.get(reverse(f"admin:{name}")).status_code == 404, name
    root = _client(User.objects.create_superuser("root", password="x"))
    html = root.get(reverse("admin:discovery_configuredagent_changelist")).content.decode()
    assert "acme_agent" in html and "beta_agent" in html


def test_a_tenant_admin_sees_its_tenants_alerts_and_sessions(world):
    """Its tenant's discovery alerts (listed, opened, acknowledged, counted on the dashboard)
    and session pins (listed, opened read-only, ended); another tenant's and the platform's
    alerts are 404s and counted nowhere."""
    from discovery.models import Alert, SessionPin, Snapshot

    alerts, pins = {}, {}
    for tenant in ("acme", "beta", None):
        alerts[tenant] = Alert.objects.create(
            tenant_id=tenant, kind=Alert.Kind.CAP_REACHED, subject="snapshot",
            message=f"cap of {tenant or 'platform'}")
    for tenant in ("acme", "beta"):
        snap = Snapshot.objects.create(tenant_id=tenant, version=1, digest=f"{tenant}-digest")
        pins[tenant] = SessionPin.objects.create(tenant_id=tenant, snapshot=snap,
                                                 session_id=f"{tenant}-session")
    ann = _client(_tenant_admin("ann", "acme"))

    listing = ann.get(reverse("admin:discovery_alert_changelist")).content.decode()
    assert "cap of acme" in listing
    assert "cap of beta" not in listing and "cap of platform" not in listing
    assert ann.get(_change("discovery_alert", alerts["acme"].pk)).status_code == 200
    for other in ("beta", None):
        assert ann.get(_change("discovery_alert", alerts[other].pk)).status_code == 404
    index = ann.get(reverse("admin:index")).content.decode()
    assert 'id="tile-alerts"><span class="value">1</span>' in index
    # Acknowledging: its own alert; another tenant's selected by id stays as it was.
    response = ann.post(reverse("admin:discovery_alert_changelist"), {
        "action": "acknowledge",
        "_selected_action": [alerts["acme"].pk, alerts["beta"].pk, alerts[None].pk]})
    assert response.status_code == 302
    acknowledged = dict(Alert.objects.values_list("message", "acknowledged"))
    assert acknowledged == {"cap of acme": True, "cap of beta": False,
                            "cap of platform": False}

    sessions = ann.get(reverse("admin:discovery_sessionpin_changelist")).content.decode()
    assert "acme-session" in sessions and "beta-session" not in sessions
    assert ann.get(_change("discovery_sessionpin", pins["beta"].pk)).status_code == 404
    page = ann.get(_change("discovery_sessionpin", pins["acme"].pk)).content.decode()
    assert "acme-session" in page and 'name="snapshot"' not in page  # not repinned by hand
    assert ann.post(reverse("admin:discovery_sessionpin_delete", args=[pins["beta"].pk]),
                    {"post": "yes"}).status_code == 404
    ended = ann.post(reverse("admin:discovery_sessionpin_delete", args=[pins["acme"].pk]),
                     {"post": "yes"})
    assert ended.status_code == 302
    assert set(SessionPin.objects.values_list("session_id", flat=True)) == {"beta-session"}

    root = _client(User.objects.create_superuser("root", password="x"))
    listing = root.get(reverse("admin:discovery_alert_changelist")).content.decode()
    assert "cap of beta" in listing and "(platform)" in listing
    index = root.get(reverse("admin:index")).content.decode()
    assert 'id="tile-alerts"><span class="value">2</span>' in index  # beta's and the platform's
