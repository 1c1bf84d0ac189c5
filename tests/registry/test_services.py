"""Registry services called directly: registration, leases, events, permissions, expiry."""

from datetime import timedelta

import pytest
from django.utils import timezone

from registry import selectors, services
from registry.models import Agent, CardVersion
from registry.permissions import SYSTEM, Actor, PermissionDenied
from tests.conftest import make_client
from tests.registry.cards import card_03, card_10


def actor_for(client) -> Actor:
    return Actor(
        client_id=client.client_id, scopes=frozenset(client.scopes),
        allowed_agents=frozenset(client.allowed_agents), api_client_pk=client.pk,
    )


@pytest.mark.django_db(transaction=True)
def test_register_reregister_keeps_registered_at_and_records_history(recorded_events):
    agent, created = services.agent_register(actor=SYSTEM, agent_id="echo-1", card=card_03())
    assert created and agent.status == Agent.Status.ACTIVE
    assert agent.ttl_seconds == 90 and agent.max_concurrency == 100
    first_registered = agent.registered_at
    again, created = services.agent_register(
        actor=SYSTEM, agent_id="echo-1", card=card_03(tags=("echo", "new")), ttl_seconds=30
    )
    assert not created
    assert again.registered_at == first_registered
    assert again.last_seen > first_registered and again.ttl_seconds == 30
    assert Agent.objects.count() == 1
    assert CardVersion.objects.filter(agent=again).count() == 2
    assert [e.kind for e in recorded_events] == ["registered", "updated"]
    assert recorded_events[0].route.endpoint == "http://127.0.0.1:9/"


@pytest.mark.django_db
def test_same_card_twice_is_one_history_row():
    services.agent_register(actor=SYSTEM, agent_id="echo-1", card=card_03())
    services.agent_register(actor=SYSTEM, agent_id="echo-1", card=card_03())
    assert CardVersion.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"agent_id": "A"}, "invalid agent_id"),
        ({"agent_id": "_AGENTS_.x"}, "reserved prefix"),
        ({"agent_id": "ok-id", "ttl_seconds": "10"}, "ttl_seconds must be an integer"),
        ({"agent_id": "ok-id", "ttl_seconds": 0}, "ttl_seconds must be between"),
        ({"agent_id": "ok-id", "max_concurrency": 0}, "max_concurrency"),
        ({"agent_id": "ok-id", "url": "file:///etc/passwd"}, "url: url must be an absolute"),
        ({"agent_id": "ok-id", "url": "http://169.254.169.254/"}, "metadata"),
    ],
)
def test_invalid_registrations_write_nothing(kwargs, message):
    kwargs.setdefault("card", card_03())
    with pytest.raises(services.InvalidInput, match=message):
        services.agent_register(actor=SYSTEM, **kwargs)
    assert Agent.objects.count() == 0


@pytest.mark.django_db
def test_card_endpoint_checked_when_no_url():
    with pytest.raises(services.InvalidInput, match="card endpoint"):
        services.agent_register(
            actor=SYSTEM, agent_id="meta", card=card_03("http://169.254.169.254/")
        )


@pytest.mark.django_db
def test_http_json_interface_stored_and_checked():
    agent, _ = services.agent_register(actor=SYSTEM, agent_id="rest-ok", card=card_10())
    assert agent.http_json_url == "http://127.0.0.1:9/rest"
    [route] = [r for r in selectors.agent_routes() if r.agent_id == "rest-ok"]
    assert route.http_json_endpoint == "http://127.0.0.1:9/rest"
    assert selectors.agent_route(agent).http_json_endpoint == "http://127.0.0.1:9/rest"
    other, _ = services.agent_register(actor=SYSTEM, agent_id="no-rest", card=card_03())
    assert other.http_json_url == ""
    card = card_10()
    card["supportedInterfaces"][1]["url"] = "http://169.254.169.254/rest"
    with pytest.raises(services.InvalidInput, match="card HTTP\\+JSON interface"):
        services.agent_register(actor=SYSTEM, agent_id="rest-meta", card=card)
    assert not Agent.objects.filter(agent_id="rest-meta").exists()


@pytest.mark.django_db
def test_register_scope_and_ownership():
    owner, _ = make_client(["register"], name="owner")
    other, _ = make_client(["register"], name="other")
    caller, _ = make_client(["call"], name="caller")
    limited, _ = make_client(["register"], agents=["only-this"], name="limited")
    services.agent_register(actor=actor_for(owner), agent_id="mine", card=card_03())
    with pytest.raises(PermissionDenied, match="belongs to another client"):
        services.agent_register(actor=actor_for(other), agent_id="mine", card=card_03())
    with pytest.raises(PermissionDenied):
        services.agent_heartbeat(actor=actor_for(other), agent_id="mine")
    with pytest.raises(PermissionDenied):
        services.agent_deregister(actor=actor_for(other), agent_id="mine")
    with pytest.raises(PermissionDenied, match="lacks the register scope"):
        services.agent_register(actor=actor_for(caller), agent_id="x-1", card=card_03())
    with pytest.raises(PermissionDenied, match="may not register"):
        services.agent_register(actor=actor_for(limited), agent_id="not-that", card=card_03())
    services.agent_register(actor=actor_for(limited), agent_id="only-this", card=card_03())
    services.agent_heartbeat(actor=actor_for(owner), agent_id="mine")
    services.agent_deregister(actor=actor_for(owner), agent_id="mine")
    assert list(Agent.objects.values_list("agent_id", flat=True)) == ["only-this"]


@pytest.mark.django_db
def test_heartbeat_extends_lease_and_unknown_is_not_found():
    agent, _ = services.agent_register(actor=SYSTEM, agent_id="hb", card=card_03(), ttl_seconds=5)
    before = agent.expires_at
    beat = services.agent_heartbeat(actor=SYSTEM, agent_id="hb")
    assert beat.expires_at > before
    assert Agent.objects.get(agent_id="hb").expires_at == beat.expires_at
    with pytest.raises(services.AgentNotFound):
        services.agent_heartbeat(actor=SYSTEM, agent_id="nobody")


@pytest.mark.django_db(transaction=True)
def test_expiry_marks_then_purges_and_fires_events(recorded_events, settings):
    services.agent_register(actor=SYSTEM, agent_id="short", card=card_03(), ttl_seconds=1)
    services.agent_register(actor=SYSTEM, agent_id="long", card=card_10(), ttl_seconds=600)
    recorded_events.clear()
    later = timezone.now() + timedelta(seconds=2)
    assert services.agents_expire(now=later) == {"expired": 1, "purged": 0}
    assert Agent.objects.get(agent_id="short").status == Agent.Status.EXPIRED
    assert [(e.kind, e.agent_id) for e in recorded_events] == [("expired", "short")]
    with pytest.raises(services.AgentNotFound):
        services.agent_heartbeat(actor=SYSTEM, agent_id="short")
    settings.A2A_EXPIRED_RETENTION_SECONDS = 60
    result = services.agents_expire(now=later + timedelta(seconds=61))
    assert result["purged"] >= 1
    assert list(Agent.objects.values_list("agent_id", flat=True)) == ["long"]


@pytest.mark.django_db
def test_update_and_extend_ttl():
    services.agent_register(actor=SYSTEM, agent_id="upd", card=card_03())
    agent = services.agent_update(actor=SYSTEM, agent_id="upd", max_concurrency=7,
                                  url="http://127.0.0.1:7/")
    assert agent.max_concurrency == 7 and agent.url == "http://127.0.0.1:7/"
    with pytest.raises(services.AgentNotFound):
        services.agent_update(actor=SYSTEM, agent_id="nope", max_concurrency=1)
    Agent.objects.filter(agent_id="upd").update(
        status=Agent.Status.EXPIRED, expires_at=timezone.now()
    )
    assert services.agents_extend_ttl(agent_ids=["upd"]) == 1
    assert Agent.objects.get(agent_id="upd").is_routable


@pytest.mark.django_db
def test_api_client_tokens_are_hashed():
    client, token = services.api_client_create(name="Hash Me", scopes=["call"])
    assert client.client_id == "hash-me"
    assert token not in client.hashed_key and token not in client.id
    from registry.selectors import actor_from_token

    assert actor_from_token(token=token).client_id == "hash-me"
    assert actor_from_token(token=token + "x") is None
    with pytest.raises(services.InvalidInput, match="scopes"):
        services.api_client_create(name="bad", scopes=["root"])
    with pytest.raises(services.InvalidInput, match="exists already"):
        services.api_client_create(name="Hash Me", scopes=["call"])


@pytest.mark.django_db
def test_anonymous_heartbeats_only_unowned_agents(settings):
    from registry.permissions import anonymous_actor

    settings.A2A_ALLOW_ANONYMOUS = True
    anon = anonymous_actor()
    owner, _ = make_client(["register"], name="owner")
    services.agent_register(actor=actor_for(owner), agent_id="owned", card=card_03())
    services.agent_register(actor=anon, agent_id="unowned", card=card_03())
    assert services.agent_heartbeat(actor=anon, agent_id="unowned").agent_id == "unowned"
    with pytest.raises(PermissionDenied):
        services.agent_heartbeat(actor=anon, agent_id="owned")
    beat = services.agent_heartbeat(actor=SYSTEM, agent_id="owned")
    assert beat.ttl_seconds == 90


@pytest.mark.django_db(transaction=True)
def test_agents_of_a_dead_node_expire(recorded_events, settings):
    """KubeMQ: when a node goes down its agents expire everywhere and must re-register."""
    from registry.models import Node

    now = timezone.now()
    Node.objects.create(node_id="alive", last_heartbeat=now)
    Node.objects.create(node_id="gone", last_heartbeat=now - timedelta(minutes=5))
    services.agent_register(actor=SYSTEM, agent_id="on-alive", card=card_03(), node_id="alive")
    services.agent_register(actor=SYSTEM, agent_id="on-gone", card=card_03(), node_id="gone")
    recorded_events.clear()
    assert services.agents_expire(now=now)["expired"] == 1
    assert [(e.kind, e.agent_id) for e in recorded_events] == [("expired", "on-gone")]
    with pytest.raises(services.AgentNotFound):
        services.agent_heartbeat(actor=SYSTEM, agent_id="on-gone")
    services.agent_heartbeat(actor=SYSTEM, agent_id="on-alive")


@pytest.mark.django_db
def test_registrations_made_off_node_go_to_a_live_node(settings):
    """A Celery worker or a command is no node: what it registers is owned by a live one."""
    from registry.models import Node

    now = timezone.now()
    settings.NODE_ID = "worker-process"
    # No live node known: this process's id (embedded mode, or a cluster starting).
    agent, _ = services.agent_register(actor=SYSTEM, agent_id="early", card=card_03())
    assert agent.node_id == "worker-process"
    Node.objects.create(node_id="node-a", last_heartbeat=now)
    Node.objects.create(node_id="node-b", last_heartbeat=now)
    Node.objects.create(node_id="node-dead", last_heartbeat=now - timedelta(minutes=5))
    owners = {
        services.agent_register(actor=SYSTEM, agent_id=f"d-{i}", card=card_03())[0].node_id
        for i in range(12)
    }
    assert owners == {"node-a", "node-b"}
    # Re-registration keeps a live owner; a registration arriving at a live node stays there.
    first = Agent.objects.get(agent_id="d-0").node_id
    assert services.agent_register(actor=SYSTEM, agent_id="d-0", card=card_03())[0].node_id \
        == first
    settings.NODE_ID = "node-b"
    assert services.agent_register(actor=SYSTEM, agent_id="here", card=card_03())[0].node_id \
        == "node-b"


@pytest.mark.django_db
def test_a_serving_node_owns_what_registers_there_before_its_first_beat(settings, monkeypatch):
    """A node just started (its heartbeat row not written yet) while the database still lists
    other nodes as live (ones that just died): a registration arriving at it is its own, not
    handed to a node that may be dead."""
    from core import lifecycle as node_config
    from registry.models import Node

    settings.NODE_ID = "fresh-node"
    Node.objects.create(node_id="just-killed", last_heartbeat=timezone.now())
    assert services.agent_register(actor=SYSTEM, agent_id="off", card=card_03())[0].node_id \
        == "just-killed"  # a process that is no node: a live node by the rows
    monkeypatch.setattr(node_config, "_started", True)  # this process serves as a node
    assert services.agent_register(actor=SYSTEM, agent_id="on", card=card_03())[0].node_id \
        == "fresh-node"


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_landing_during_the_expiry_job_is_kept(recorded_events):
    """The expiry job and a heartbeat interleaved: the heartbeat (another connection, another
    thread) commits just before the job's write. The job re-checks the lease in the statement
    that expires, so the renewed agent stays active and no `expired` event fires. (A job that
    selected expired ids first and then updated them by id expired it: the lost heartbeat.)"""
    import threading

    from django.db import connection

    services.agent_register(actor=SYSTEM, agent_id="racer", card=card_03(), ttl_seconds=1)
    services.agent_register(actor=SYSTEM, agent_id="lapsed", card=card_03(), ttl_seconds=1)
    Agent.objects.filter(agent_id__in=["racer", "lapsed"]).update(
        expires_at=timezone.now() - timedelta(seconds=5))
    recorded_events.clear()
    order: list[str] = []

    def heartbeat_elsewhere() -> None:
        from django.db import connections

        try:
            services.agent_heartbeat(actor=SYSTEM, agent_id="racer")
            order.append("heartbeat committed")
        finally:
            connections.close_all()

    def before_each_statement(execute, sql, params, many, context):
        if not order and sql.lstrip().upper().startswith("UPDATE"):
            # The job is about to write: the heartbeat lands now, in another connection.
            thread = threading.Thread(target=heartbeat_elsewhere)
            thread.start()
            thread.join(timeout=30)
        if sql.lstrip().upper().startswith("UPDATE"):
            order.append("expiry update")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(before_each_statement):
        result = services.agents_expire()

    assert order[:2] == ["heartbeat committed", "expiry update"]
    assert result["expired"] == 1
    assert Agent.objects.get(agent_id="racer").status == Agent.Status.ACTIVE
    assert Agent.objects.get(agent_id="racer").expires_at > timezone.now()
    assert Agent.objects.get(agent_id="lapsed").status == Agent.Status.EXPIRED
    assert [(e.kind, e.agent_id) for e in recorded_events] == [("expired", "lapsed")]


@pytest.mark.django_db(transaction=True)
def test_two_survivors_adopting_one_dead_node_move_each_agent_once(recorded_events):
    """Failover: two survivors adopt the same dead node's agents at the same moment. Rows are
    locked on ``node_id = <dead>`` and moved under the lock, so each agent moves once (one
    `updated` event, one new owner), spread over the live nodes, with its routing marker moved
    (other nodes' incremental resync sees it); expired agents stay where they are."""
    import threading

    from django.db import connections

    for i in range(40):
        services.agent_register(actor=SYSTEM, agent_id=f"orphan-{i}", card=card_03(),
                                node_id="dead-node")
    services.agent_register(actor=SYSTEM, agent_id="orphan-expired", card=card_03(),
                            node_id="dead-node")
    Agent.objects.filter(agent_id="orphan-expired").update(status=Agent.Status.EXPIRED)
    before = timezone.now()
    recorded_events.clear()
    barrier = threading.Barrier(2)
    moved: dict[str, list[str]] = {}

    def adopt(survivor: str) -> None:
        try:
            barrier.wait(timeout=10)
            moved[survivor] = services.agents_move_off_node(
                node_id="dead-node", to_nodes=["node-a", "node-b"])
        finally:
            connections.close_all()

    threads = [threading.Thread(target=adopt, args=(n,)) for n in ("node-a", "node-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    everything = moved["node-a"] + moved["node-b"]
    assert sorted(everything) == sorted(f"orphan-{i}" for i in range(40))  # each once
    assert [e.agent_id for e in recorded_events if e.kind == "updated"].count("orphan-0") == 1
    owners = dict(Agent.objects.filter(agent_id__startswith="orphan-")
                  .values_list("agent_id", "node_id"))
    assert owners.pop("orphan-expired") == "dead-node"
    assert set(owners.values()) == {"node-a", "node-b"}  # spread over the live nodes
    assert all(e.route.node_id == owners[e.agent_id] for e in recorded_events)
    assert not Agent.objects.filter(agent_id__startswith="orphan-", status="active",
                                    routing_changed_at__lt=before).exists()
