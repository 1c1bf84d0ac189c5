"""What one registration costs the database and the resolver: a fixed handful of statements
whatever the registry's size, and a host name resolved once per window, not per agent."""

from __future__ import annotations

import socket
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ard import indexer
from ard.models import AgentDoc
from core import lifecycle as node_config
from registry import netcheck, services
from registry.models import Agent, CardVersion
from registry.permissions import SYSTEM as SYSTEM_ACTOR
from registry.services import InvalidInput, nodes
from tests.conftest import make_client
from tests.registry.cards import card_03
from tests.services_helpers import actor_of


def _statements(ctx) -> list[str]:
    return [q["sql"].split()[0] for q in ctx.captured_queries]


@pytest.mark.django_db(transaction=True)
def test_a_registration_is_a_fixed_handful_of_statements(settings):
    settings.A2A_MAX_AGENTS_PER_CLIENT = 0  # no quota: its COUNT is the one optional read
    client, _ = make_client(["register"], name="reg")
    actor = actor_of(client)
    nodes.node_heartbeat(node_id=node_config.node_id())  # a serving node knows it is live
    for index in range(30):
        services.agent_register(actor=actor, agent_id=f"pre-{index}", card=card_03())
    with CaptureQueriesContext(connection) as new:
        services.agent_register(actor=actor, agent_id="new-one", card=card_03())
    with CaptureQueriesContext(connection) as renewal:
        services.agent_register(actor=actor, agent_id="new-one", card=card_03())
    # New: BEGIN, the locked read, INSERT ... ON CONFLICT DO NOTHING (no savepoint), the card
    # version, COMMIT; then the search index's upsert of the row the event carries (no read
    # back); the audit record goes to the console's batch or is one more INSERT.
    assert _statements(new)[:6] == ["BEGIN", "SELECT", "INSERT", "INSERT", "COMMIT",
                                    "INSERT"], _statements(new)
    # ... the audit record here, with no flusher in this process: BEGIN, INSERT, COMMIT.
    assert len(_statements(new)) <= 9, _statements(new)
    insert = new.captured_queries[2]["sql"].upper()
    if connection.vendor == "postgresql":  # the insert race is settled by the statement itself
        assert "ON CONFLICT DO NOTHING" in insert, insert
    else:  # SQLite: BEGIN IMMEDIATE holds the write lock; OR IGNORE would hide other failures
        assert "OR IGNORE" not in insert, insert
    # A renewal with the same card: the locked read and one UPDATE, then the index's one read
    # of its document (nothing to rewrite); no owner read, no card-history read.
    assert _statements(renewal) == ["BEGIN", "SELECT", "UPDATE", "COMMIT", "SELECT"]
    assert Agent.objects.get(agent_id="new-one").owner_id == client.pk
    assert CardVersion.objects.filter(agent__agent_id="new-one").count() == 1
    assert AgentDoc.objects.filter(agent_id="new-one", active=True).exists()


@pytest.mark.django_db
def test_a_host_name_is_resolved_once_per_window_and_still_refused(monkeypatch):
    calls: list[str] = []
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        calls.append(host)
        if host == "meta.cache.test":
            return real("169.254.169.254", port, *args, **kwargs)
        if host == "fine.cache.test":
            return real("127.0.0.1", port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(netcheck, "_resolve_cache", {})
    actor = actor_of(make_client(["register"], name="dns")[0])
    for index in range(3):
        services.agent_register(actor=actor, agent_id=f"fine-{index}",
                                card=card_03(f"http://fine.cache.test:{9000 + index}/"))
    assert calls.count("fine.cache.test") == 1
    for _ in range(2):  # a refused address stays refused when it comes from the cache
        with pytest.raises(InvalidInput, match="refused address"):
            services.agent_register(actor=actor, agent_id="meta-1",
                                    card=card_03("http://meta.cache.test/"))
    assert calls.count("meta.cache.test") == 1
    later = time.monotonic() + netcheck.RESOLVE_CACHE_SECONDS + 1
    monkeypatch.setattr(netcheck.time, "monotonic", lambda: later)  # the window has passed
    services.agent_register(actor=actor, agent_id="fine-9", card=card_03("http://fine.cache.test/"))
    services.agent_register(actor=actor, agent_id="fine-9", card=card_03("http://fine.cache.test/"))
    assert calls.count("fine.cache.test") >= 2


@pytest.mark.django_db(transaction=True)
def test_registrations_written_together_are_a_fixed_handful_of_statements(settings):
    """Group commit (registry.services.agents_register): on PostgreSQL, N new agents in one
    batch cost the statements of one, whatever N; with a quota, one COUNT per client."""
    if connection.vendor != "postgresql":
        pytest.skip("the multi-row statements are PostgreSQL's; SQLite writes one by one")
    settings.A2A_MAX_AGENTS_PER_CLIENT = 100
    one, two = (actor_of(make_client(["register"], name=name)[0]) for name in ("one", "two"))
    nodes.node_heartbeat(node_id=node_config.node_id())
    services.agent_register(actor=one, agent_id="old", card=card_03())
    for size in (5, 40):
        regs = [services.registration(actor=one if i % 2 else two, agent_id=f"b{size}-{i}",
                                      card=card_03(name=f"N{i}")) for i in range(size)]
        with CaptureQueriesContext(connection) as batch:
            results = services.agents_register(regs)
        assert [created for _, created in results] == [True] * size
        statements = _statements(batch)
        # One COUNT per client (the quota), then one statement: the multi-row INSERT of the
        # agents and of their card versions (a data-modifying CTE, in autocommit: its commit
        # travels with it). Then the audit records: the console's, each its own write here with
        # no flusher in this process (a node's flusher batches them). The search documents go
        # to the deferred writer's thread (its own connection).
        assert statements[:3] == ["SELECT", "SELECT", "WITH"], statements
        write = batch.captured_queries[2]["sql"]
        assert "ON CONFLICT DO NOTHING" in write.upper()
        assert '"registry_agent"' in write and '"registry_cardversion"' in write
        assert statements[3:] == ["BEGIN", "INSERT", "COMMIT"] * size, statements
        audit = [q["sql"] for q in batch.captured_queries[3:] if q["sql"].startswith("INSERT")]
        assert all('"console_registrychange"' in sql for sql in audit), audit
        indexer.settle_deferred()
        assert Agent.objects.filter(agent_id__startswith=f"b{size}-").count() == size
        assert CardVersion.objects.filter(agent__agent_id__startswith=f"b{size}-").count() == size
        assert AgentDoc.objects.filter(agent_id__startswith=f"b{size}-", active=True).count() \
            == size
    # A re-registration, an id twice and a new id in one batch: the new one is written with
    # the batch, the others after it, each in its own transaction, as agent_register does.
    regs = [services.registration(actor=one, agent_id=agent_id, card=card_03(name=name))
            for agent_id, name in (("old", "Renewed"), ("dup", "A"), ("dup", "B"),
                                   ("fresh", "F"))]
    results = services.agents_register(regs)
    assert [created for _, created in results] == [False, True, False, True]
    assert Agent.objects.get(agent_id="old").name == "Renewed"
    assert Agent.objects.get(agent_id="dup").name == "B"


@pytest.mark.django_db(transaction=True)
def test_a_batch_failing_inside_a_callers_transaction_leaves_it_usable():
    """Written together inside a caller's transaction (not the node's autocommit), a batch
    statement that fails rolls back to its savepoint: the items are written one by one and
    the caller's transaction goes on."""
    if connection.vendor != "postgresql":
        pytest.skip("the batch statement is PostgreSQL's; SQLite writes one by one")
    from django.db import transaction

    regs = [services.registration(actor=SYSTEM_ACTOR, agent_id=f"tx-{i}", card=card_03())
            for i in range(3)]
    regs[1].fields["ttl_seconds"] = 0  # violates agent_ttl_positive: the batch statement fails
    with transaction.atomic():
        results = services.agents_register(regs)
        assert Agent.objects.filter(agent_id="tx-0").exists()  # the transaction still works
    assert results[0][1] is True and results[2][1] is True  # (agent, created)
    assert isinstance(results[1], Exception)
    assert set(Agent.objects.filter(agent_id__startswith="tx-").values_list(
        "agent_id", flat=True)) == {"tx-0", "tx-2"}
