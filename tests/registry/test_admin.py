"""The Django admin as the management UI: lists, search, filters, actions, card view, clients."""

from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import urlencode

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from registry import selectors, services
from registry.models import Agent, ApiClient, CardVersion, Node
from registry.permissions import SYSTEM
from tests.conftest import make_client
from tests.registry.cards import card_03, card_kubemq

AGENTS_URL = reverse("admin:registry_agent_changelist")
CLIENTS_URL = reverse("admin:registry_apiclient_changelist")
NODES_URL = reverse("admin:registry_node_changelist")


def add_agents(count: int, *, start: int = 0) -> None:
    for i in range(start, start + count):
        owner, _ = make_client(["register"], name=f"owner-{i}")
        services.agent_register(
            actor=SYSTEM, agent_id=f"agent-{i:03d}", card=card_03(tags=("echo", f"t{i}")),
            node_id=f"node-{i % 3}",
        )
        Agent.objects.filter(agent_id=f"agent-{i:03d}").update(owner=owner)
        services.node_heartbeat(node_id=f"node-{i % 3}", address=f"10.0.0.{i % 3}:8000")


def queries_for(client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200
    return len(ctx.captured_queries)


# --- query counts --------------------------------------------------------------------------


def test_changelists_query_count_stays_flat_from_3_to_30_rows(admin_client):
    add_agents(3)
    small = {url: queries_for(admin_client, url) for url in (AGENTS_URL, CLIENTS_URL, NODES_URL)}
    add_agents(27, start=3)
    assert Agent.objects.count() == 30 and ApiClient.objects.count() == 30
    large = {url: queries_for(admin_client, url) for url in (AGENTS_URL, CLIENTS_URL, NODES_URL)}
    assert large == small
    assert small[AGENTS_URL] <= 10  # session, user, counts, filter choices, one page of rows


def test_agent_changelist_shows_what_an_operator_needs(admin_client):
    add_agents(2)
    Agent.objects.filter(agent_id="agent-001").update(
        expires_at=timezone.now() - timedelta(seconds=5)
    )
    html = admin_client.get(AGENTS_URL).content.decode()
    for text in ("agent-000", "Echo Agent", "node-0", "echo, t0", "owner-0", "100",
                 'class="badge badge-expired"', 'class="badge badge-active"', "Last seen",
                 "Expires", "Max concurrency", "Requests (15 min)", "Errors (15 min)"):
        assert text in html, text
    # Relative times with the exact time on hover.
    assert re.search(r'<time class="console-ago" datetime="[^"]+" title="\d{4}-\d\d-\d\d '
                     r'\d\d:\d\d:\d\d UTC">\d+ s ago</time>', html)
    assert "delete_selected" not in html
    assert 'value="extend_ttl"' in html and 'value="deregister"' in html


# --- search and filters ----------------------------------------------------------------------


def _listed(admin_client, **params) -> set[str]:
    html = admin_client.get(AGENTS_URL, params).content.decode()
    return set(re.findall(r'class="field-agent_key"><a [^>]*>([^<]+)</a>', html))


def test_search_and_filters(admin_client):
    add_agents(3)
    services.agent_register(actor=SYSTEM, agent_id="kube-agent",
                            card=card_kubemq("kube-agent"), source=Agent.Source.KUBEMQ)
    Agent.objects.filter(agent_id="agent-002").update(status=Agent.Status.EXPIRED)
    assert _listed(admin_client) == {"agent-000", "agent-001", "agent-002", "kube-agent"}
    assert _listed(admin_client, q="t1") == {"agent-001"}  # a skill tag
    assert _listed(admin_client, q="kube-agent") == {"kube-agent"}  # the id
    assert _listed(admin_client, q="simple echo agent") == {"kube-agent"}  # the description
    assert _listed(admin_client, q="Echo Agent") == {"agent-000", "agent-001", "agent-002",
                                                     "kube-agent"}  # the name
    assert _listed(admin_client, status__exact="expired") == {"agent-002"}
    assert _listed(admin_client, source__exact="kubemq") == {"kube-agent"}
    assert _listed(admin_client, node_id="node-1") == {"agent-001"}


# --- the agent page ------------------------------------------------------------------------


def test_agent_page_shows_the_card_pretty_and_escaped_with_its_history(admin_client):
    card = card_03()
    card["description"] = '<script>alert("x")</script> & more'
    services.agent_register(actor=SYSTEM, agent_id="echo-1", card=card)
    card["skills"][0]["id"] = "echo-v2"
    services.agent_register(actor=SYSTEM, agent_id="echo-1", card=card)
    url = reverse("admin:registry_agent_change", args=[Agent.objects.get().pk])
    html = admin_client.get(url).content.decode()
    assert '<script>alert("x")' not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; more" in html
    assert '<pre class="a2a-card">{\n  &quot;name&quot;: &quot;Echo Agent&quot;,' in html
    assert html.count('class="a2a-card"') == 3  # the current card and two history entries
    assert "echo-v2" in html and "card history" in html.lower()
    assert reverse("agent-card", kwargs={"agent_id": "echo-1"}) in html


def test_agent_page_edits_go_through_the_service(admin_client, recorded_events,
                                                 django_capture_on_commit_callbacks):
    services.agent_register(actor=SYSTEM, agent_id="echo-1", card=card_03(), ttl_seconds=60)
    agent = Agent.objects.get()
    url = reverse("admin:registry_agent_change", args=[agent.pk])
    with django_capture_on_commit_callbacks(execute=True):
        r = admin_client.post(url, {
            "ttl_seconds": "600", "max_concurrency": "7",
            "card_versions-TOTAL_FORMS": "1", "card_versions-INITIAL_FORMS": "1",
            "card_versions-MIN_NUM_FORMS": "0", "card_versions-MAX_NUM_FORMS": "1000",
            "card_versions-0-id": str(agent.card_versions.get().pk),
            "card_versions-0-agent": str(agent.pk),
        })
    assert r.status_code == 302, r.content.decode()[:3000]
    agent.refresh_from_db()
    assert (agent.ttl_seconds, agent.max_concurrency) == (600, 7)
    assert agent.expires_at > timezone.now() + timedelta(seconds=500)
    assert [(e.kind, e.route.max_concurrency) for e in recorded_events] == [("updated", 7)]
    r = admin_client.post(url, {"ttl_seconds": "0", "max_concurrency": "7"})
    assert r.status_code == 200 and "Ensure this value is greater than" in r.content.decode()


# --- actions -------------------------------------------------------------------------------


def test_extend_ttl_action_renews_leases(admin_client, recorded_events,
                                         django_capture_on_commit_callbacks):
    add_agents(3)
    past = timezone.now() - timedelta(seconds=30)
    Agent.objects.update(expires_at=past, status=Agent.Status.EXPIRED)
    with django_capture_on_commit_callbacks(execute=True):
        r = admin_client.post(AGENTS_URL, {
            "action": "extend_ttl", "_selected_action": [
                str(a.pk) for a in Agent.objects.filter(agent_id__in=["agent-000", "agent-002"])
            ],
        }, follow=True)
    assert "Extended the lease of 2 agent(s)." in r.content.decode()
    routable = set(Agent.objects.routable().values_list("agent_id", flat=True))
    assert routable == {"agent-000", "agent-002"}
    assert sorted((e.kind, e.agent_id) for e in recorded_events) == [
        ("updated", "agent-000"), ("updated", "agent-002")]


def test_deregister_action_and_delete_button_go_through_the_service(
    admin_client, recorded_events, django_capture_on_commit_callbacks
):
    add_agents(3)
    with django_capture_on_commit_callbacks(execute=True):
        r = admin_client.post(AGENTS_URL, {
            "action": "deregister",
            "_selected_action": [str(Agent.objects.get(agent_id="agent-001").pk)],
        }, follow=True)
    assert "Deregistered 1 agent(s)." in r.content.decode()
    assert set(Agent.objects.values_list("agent_id", flat=True)) == {"agent-000", "agent-002"}
    pk = Agent.objects.get(agent_id="agent-002").pk
    with django_capture_on_commit_callbacks(execute=True):
        r = admin_client.post(reverse("admin:registry_agent_delete", args=[pk]), {"post": "yes"})
    assert r.status_code == 302
    assert list(Agent.objects.values_list("agent_id", flat=True)) == ["agent-000"]
    assert CardVersion.objects.count() == 1
    assert [(e.kind, e.agent_id) for e in recorded_events] == [
        ("deregistered", "agent-001"), ("deregistered", "agent-002")]


def test_add_agent_is_register_by_url_with_inline_errors(admin_client):
    add = reverse("admin:registry_agent_add")
    page = admin_client.get(add).content.decode()
    assert "Register an agent by URL" in page and 'name="url"' in page
    cases = [
        ({"agent_id": "Bad_Id", "url": "http://127.0.0.1:9/"}, "invalid agent_id"),
        ({"agent_id": "meta", "url": "http://169.254.169.254/"}, "url:"),
        ({"agent_id": "ok-agent", "url": "ftp://example.com/"}, "http or https"),
        ({"agent_id": "ok-agent", "url": "http://127.0.0.1:9/"}, "card"),  # nothing listens
        ({"agent_id": "ok-agent", "url": "http://127.0.0.1:9/", "ttl_seconds": "0"},
         "greater than or equal to 1"),
    ]
    for data, error in cases:
        r = admin_client.post(add, data)
        html = r.content.decode()
        assert r.status_code == 200 and error in html, (data, html[-3000:])
        assert 'class="errorlist' in html
    assert not Agent.objects.exists()


# --- API clients -----------------------------------------------------------------------------


def test_creating_a_client_shows_its_token_once(admin_client):
    r = admin_client.post(reverse("admin:registry_apiclient_add"), {
        "name": "Billing Caller", "client_id": "", "scopes": ["call", "register"],
        "allowed_agents": "billing-agent\n billing-agent, refunds-agent", "expiry_date": "",
    }, follow=True)
    assert r.status_code == 200
    page = r.content.decode()
    match = re.search(r"The token of billing-caller is: (\S+) ", page)
    assert match, page[:3000]
    token = match.group(1)
    client = ApiClient.objects.get(client_id="billing-caller")
    assert client.scopes == ["call", "register"]
    assert client.allowed_agents == ["billing-agent", "refunds-agent"]
    assert token not in client.hashed_key and token not in client.pk
    actor = selectors.actor_from_token(token=token)
    assert actor is not None and actor.client_id == "billing-caller"
    assert actor.scopes == frozenset({"call", "register"})
    # Never shown again: not on the list, not on the client's page.
    assert token not in admin_client.get(CLIENTS_URL).content.decode()
    change = reverse("admin:registry_apiclient_change", args=[client.pk])
    html = admin_client.get(change).content.decode()
    assert token not in html and client.hashed_key not in html.replace(client.pk, "")


def test_client_form_refuses_bad_input_without_writing(admin_client):
    make_client(["call"], name="taken")
    add = reverse("admin:registry_apiclient_add")
    cases = [
        ({"name": "taken", "scopes": ["call"]}, "exists already"),
        ({"name": "x", "client_id": "taken", "scopes": ["call"]}, "exists already"),
        ({"name": "!!!", "scopes": ["call"]}, "letters or digits"),
        ({"name": "ok", "scopes": []}, "This field is required"),
        ({"name": "ok", "scopes": ["root"]}, "Select a valid choice"),
        ({"name": "ok", "scopes": ["call"], "allowed_agents": "Bad_Id"}, "invalid agent_id"),
    ]
    for data, error in cases:
        r = admin_client.post(add, {"client_id": "", "allowed_agents": "", **data})
        assert r.status_code == 200 and error in r.content.decode(), data
    assert list(ApiClient.objects.values_list("client_id", flat=True)) == ["taken"]


def test_editing_and_revoking_a_client(admin_client):
    client, token = make_client(["call"], name="caller", agents=["a1"])
    change = reverse("admin:registry_apiclient_change", args=[client.pk])
    r = admin_client.post(change, {
        "name": "Caller", "scopes": ["call", "register"], "allowed_agents": "a1, b2",
        "expiry_date": "",
    })
    assert r.status_code == 302, r.content.decode()[:3000]
    client.refresh_from_db()
    assert (client.name, client.scopes, client.allowed_agents) == (
        "Caller", ["call", "register"], ["a1", "b2"])
    assert selectors.actor_from_token(token=token).scopes == frozenset({"call", "register"})
    r = admin_client.post(CLIENTS_URL, {"action": "revoke", "_selected_action": [client.pk]},
                          follow=True)
    assert "Revoked 1 client(s)." in r.content.decode()
    assert selectors.actor_from_token(token=token) is None
    html = admin_client.get(change).content.decode()
    assert 'name="scopes"' not in html  # a revoked client is read-only
    assert "delete_selected" not in admin_client.get(CLIENTS_URL).content.decode()


# --- nodes -----------------------------------------------------------------------------------


def test_node_list_counts_agents_and_is_read_only(admin_client):
    add_agents(4)
    Node.objects.filter(node_id="node-2").update(
        last_heartbeat=timezone.now() - timedelta(hours=1)
    )
    html = admin_client.get(NODES_URL).content.decode()
    rows = re.findall(r'<tr>.*?</tr>', html, re.S)
    counts = {
        m.group(1): m.group(2)
        for row in rows
        if (m := re.search(r'>(node-\d)<.*?class="field-agent_count">(\d+)<', row, re.S))
    }
    assert counts == {"node-0": "2", "node-1": "1", "node-2": "1"}
    assert html.count("icon-yes.svg") == 2 and html.count("icon-no.svg") == 1
    assert admin_client.get(reverse("admin:registry_node_add")).status_code == 403


def test_only_the_platforms_own_clients_are_offered(admin_client):
    html = admin_client.get(reverse("admin:index")).content.decode()
    assert "API clients" in html and "API keys" not in html


def test_agent_changelist_query_count_is_the_same_for_5_and_50_agents(admin_client):
    """Every page of the agent list (plain, searched, filtered, sorted by each sortable column)
    reads the same number of queries whatever the rows shown: no per-row query for the
    badges, relative times, owners, traffic columns or the node filter's choices."""
    from console.models import AgentMinute

    def add(start: int, count: int) -> None:
        add_agents(count, start=start)
        minute = timezone.now().replace(second=0, microsecond=0)
        for i in range(start, start + count):
            AgentMinute.objects.create(agent_id=f"agent-{i:03d}", node_id="n1", minute=minute,
                                       requests=i + 1, last_call_at=minute, last_outcome="ok")

    pages = [{}, {"q": "echo"}, {"node_id": "node-1"}, {"status__exact": "active"},
             {"public__exact": "0"}, *({"o": str(column)} for column in (2, 3, 4, 5, 6, 7, 11))]

    def counts() -> list[int]:
        return [queries_for(admin_client, f"{AGENTS_URL}?{urlencode(page)}") for page in pages]

    add(0, 5)
    # The first search of a process loads the search index's vectors (ard.vectors): once.
    queries_for(admin_client, f"{AGENTS_URL}?q=echo")
    small = counts()
    add(5, 45)
    assert Agent.objects.count() == 50
    html = admin_client.get(AGENTS_URL, {"q": "echo"}).content.decode()
    assert html.count('class="field-agent_key"') == 50  # every row shown: one page of 100
    # The node filter's choices are the nodes (read from the nodes table).
    assert all(f"?node_id=node-{i}" in html for i in range(3))
    assert counts() == small
    assert max(small) <= 8
