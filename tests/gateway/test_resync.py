"""The incremental routing resync: a node whose registry event was lost (another node's service
call whose broadcast never arrived) catches up at its next incremental resync, which reads only
the rows whose routing marker moved, the lapsed leases and the deregistrations. Real services,
real database (SQLite embedded, PostgreSQL with DATABASE_URL), a real node; only the event is
dropped, by taking the node's subscription away during the write."""

from __future__ import annotations

import contextlib
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from gateway.conf import NodeSettings
from gateway.layers import InMemoryChannelLayer
from gateway.runtime import GatewayNode
from registry import events, selectors, services
from registry.models import Agent
from registry.permissions import SYSTEM, Actor
from tests.conftest import make_client
from tests.registry.cards import card_03

NODE = "resync-node"


@contextlib.contextmanager
def _events_lost():
    """Registry events published inside are delivered to nobody (as if the broadcast from
    the node that made the change never arrived)."""
    saved = list(events._subscribers)
    events._subscribers.clear()
    try:
        yield
    finally:
        events._subscribers.extend(saved)


def _register(agent_id: str, *, node_id: str = NODE, actor=SYSTEM, lost: bool = True) -> None:
    url = f"http://127.0.0.1:9/{agent_id}/"
    with _events_lost() if lost else contextlib.nullcontext():
        services.agent_register(
            actor=actor, agent_id=agent_id, url=url, card=card_03(url), node_id=node_id
        )


def _quietly(fn, **kwargs):
    with _events_lost():
        return fn(**kwargs)


def run(fn):
    """``fn`` (a synchronous service or query) off the test's loop, where the node lives; its
    database connection closed after each call (the test database can then be dropped)."""
    return database_sync_to_async(fn, thread_sensitive=False)


@pytest.fixture
async def node(transactional_db):
    settings = NodeSettings.from_django().but(
        NODE_ID=NODE,
        A2A_ROUTING_RESYNC_SECONDS=3600,  # the test runs each resync itself
        A2A_ROUTING_FULL_RESYNC_SECONDS=3600,
        A2A_GC_FREEZE=False,
    )
    node = GatewayNode(settings, layer=InMemoryChannelLayer(), broadcast=False)
    await node.start()
    try:
        yield node
    finally:
        await node.stop()


async def _incremental(node: GatewayNode) -> None:
    before = dict(node.resyncs)
    await node.resync()
    assert node.resyncs == {**before, "incremental": before["incremental"] + 1}


async def test_a_missed_registration_is_picked_up_incrementally(node):
    assert node.resyncs == {"full": 1, "incremental": 0}  # the load at start
    await run(_register)("missed-reg")
    assert node.table.get("missed-reg") is None  # the event never arrived
    await _incremental(node)
    route = node.table.get("missed-reg")
    assert route is not None and route.node_id == NODE
    assert "missed-reg" in node.manager.subscribers  # this node owns it: subscribed


async def test_a_missed_update_and_ownership_change_are_picked_up(node):
    await run(_register)("moving", lost=False)
    assert node.table.get("moving").max_concurrency != 3
    assert "moving" in node.manager.subscribers
    await run(_quietly)(services.agent_update, actor=SYSTEM, agent_id="moving", max_concurrency=3)
    await _incremental(node)
    assert node.table.get("moving").max_concurrency == 3
    # Another node's re-registration moves the agent there: the route follows, the subscriber
    # here goes.
    await run(_register)("moving", node_id="elsewhere")
    await _incremental(node)
    assert node.table.get("moving").node_id == "elsewhere"
    assert "moving" not in node.manager.subscribers


async def test_a_missed_deregistration_is_picked_up(node):
    await run(_register)("leaving", lost=False)
    assert "leaving" in node.manager.subscribers
    await run(_quietly)(services.agent_deregister, actor=SYSTEM, agent_id="leaving")
    assert node.table.get("leaving") is not None  # the event never arrived
    await _incremental(node)
    assert node.table.get("leaving") is None
    assert "leaving" not in node.manager.subscribers
    # Registered again after its deregistration: the new row wins over the tombstone.
    await run(_register)("leaving")
    await _incremental(node)
    assert node.table.get("leaving") is not None


async def test_an_expired_agent_leaves_the_table(node):
    await run(_register)("expiring", lost=False)
    await run(_register)("staying", lost=False)
    past = timezone.now() - timedelta(seconds=5)
    await run(Agent.objects.filter(agent_id="expiring").update)(expires_at=past)
    await run(_quietly)(services.agents_expire)
    assert node.table.get("expiring") is not None  # the "expired" event never arrived
    await _incremental(node)
    assert node.table.get("expiring") is None
    assert "expiring" not in node.manager.subscribers
    assert node.table.get("staying") is not None


async def test_a_lapsed_lease_leaves_and_a_reviving_heartbeat_brings_it_back(node):
    """No expiry job ran: the incremental resync drops an agent whose lease lapsed; a
    heartbeat that renews a lapsed lease moves the routing marker, so it comes back."""
    client, token = await run(make_client)(["register"])
    actor = await run(selectors.actor_from_token)(token=token)
    await run(_register)("lapsing", actor=actor, lost=False)
    past = timezone.now() - timedelta(seconds=1)
    await run(Agent.objects.filter(agent_id="lapsing").update)(expires_at=past)
    await _incremental(node)
    assert node.table.get("lapsing") is None
    await run(services.agent_heartbeat)(actor=actor, agent_id="lapsing")
    await _incremental(node)
    assert node.table.get("lapsing") is not None
    assert "lapsing" in node.manager.subscribers


async def test_a_live_heartbeat_does_not_move_the_routing_marker(node):
    """Heartbeats are the hot write: they must not make every resync re-read the agent."""
    client, token = await run(make_client)(["register"])
    actor = await run(selectors.actor_from_token)(token=token)
    await run(_register)("beating", actor=actor, lost=False)
    marker = (await run(Agent.objects.get)(agent_id="beating")).routing_changed_at
    await run(services.agent_heartbeat)(actor=actor, agent_id="beating")
    agent = await run(Agent.objects.get)(agent_id="beating")
    assert agent.routing_changed_at == marker and agent.last_seen > marker


async def test_a_purged_row_is_caught_by_the_full_resync(node):
    """A row deleted outside the services (no tombstone) is what the periodic full reload is
    for: the incremental one cannot see it, the full one drops it."""
    await run(_register)("purged", lost=False)
    await run(Agent.objects.filter(agent_id="purged").delete)()
    await _incremental(node)
    assert node.table.get("purged") is not None
    await node.resync(full=True)
    assert node.resyncs["full"] == 2
    assert node.table.get("purged") is None
    assert "purged" not in node.manager.subscribers


async def test_an_admin_lease_extension_revives_an_expired_agent(node):
    await run(_register)("revived", lost=False)
    past = timezone.now() - timedelta(seconds=5)
    await run(Agent.objects.filter(agent_id="revived").update)(expires_at=past)
    await run(_quietly)(services.agents_expire)
    await _incremental(node)
    assert node.table.get("revived") is None
    await run(_quietly)(services.agents_extend_ttl, agent_ids=["revived"])
    await _incremental(node)
    assert node.table.get("revived") is not None


async def test_a_bulk_lease_renewal_moves_the_marker_only_of_lapsed_leases(node):
    """Discovery renews its agents' leases in bulk: a live lease leaves routing alone, a
    lapsed one (dropped by the last resync) comes back at the next."""
    await run(_register)("live-lease", lost=False)
    await run(_register)("lapsed-lease", lost=False)
    past = timezone.now() - timedelta(seconds=1)
    await run(Agent.objects.filter(agent_id="lapsed-lease").update)(expires_at=past)
    await _incremental(node)
    assert node.table.get("lapsed-lease") is None
    live_marker = (await run(Agent.objects.get)(agent_id="live-lease")).routing_changed_at
    renewed = await run(services.agents_renew_leases)(
        agent_ids=["live-lease", "lapsed-lease"], ttl_seconds=60
    )
    assert renewed == 2
    live = await run(Agent.objects.get)(agent_id="live-lease")
    assert live.routing_changed_at == live_marker
    await _incremental(node)
    assert node.table.get("lapsed-lease") is not None


async def test_table_watchers_hear_what_events_and_resyncs_changed(node):
    """``RoutingTable.watch`` (what the MCP bridge's change notifications hang on) hears every
    change once, whichever way it arrived; nothing when nothing changed."""
    heard: list[set[str]] = []
    unwatch = node.table.watch(lambda ids: heard.append(set(ids)))
    await run(_register)("watched-event", lost=False)  # the event
    await run(_register)("watched-missed")  # its event lost: the incremental resync
    await _incremental(node)
    await _incremental(node)  # nothing changed since
    await run(_quietly)(services.agent_deregister, actor=SYSTEM, agent_id="watched-missed")
    await node.resync(full=True)  # the full resync's comparison
    unwatch()
    await run(_register)("unwatched", lost=False)

    assert heard == [{"watched-event"}, {"watched-missed"}, {"watched-missed"}]


def _shared_agent() -> Actor:
    """Tenants acme and beta; beta's agent ``secret`` shared with acme (its event delivered);
    acme's caller."""
    for slug in ("acme", "beta"):
        services.tenant_create(slug=slug)
    beta = selectors.actor_from_token(token=services.api_client_create(
        name="beta-reg", scopes=["register"], tenant="beta")[1])
    acme = selectors.actor_from_token(token=services.api_client_create(
        name="acme-call", scopes=["call"], tenant="acme")[1])
    _register("secret", actor=beta, lost=False)
    services.agent_update(actor=beta, agent_id="secret", visibility="shared",
                          shared_with=["acme"])
    return acme


async def test_a_shared_agent_stays_in_reach_of_its_tenants_through_every_resync(node):
    """The tenants an agent is shared with are routing data: a node that reloads its table
    (every full resync, every start) must still let them call it, and tell the watchers of
    no change."""
    acme = await run(_shared_agent)()
    assert acme.may_call("beta.secret", node.table.get("beta.secret"))
    heard: list[set[str]] = []
    unwatch = node.table.watch(lambda ids: heard.append(set(ids)))
    await node.resync(full=True)
    await run(Agent.objects.filter(agent_id="secret").update)(routing_changed_at=timezone.now())
    await _incremental(node)
    unwatch()
    route = node.table.get("beta.secret")
    assert route.shared_with == ("acme",)
    assert acme.may_call("beta.secret", route)
    assert heard == []
