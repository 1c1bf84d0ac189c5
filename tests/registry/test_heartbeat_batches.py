"""Heartbeats that arrive together are renewed together (group commit): one statement on
PostgreSQL for a whole batch, each heartbeat keeping its own owner check and its own answer."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from registry import services
from registry.models import Agent
from registry.permissions import SYSTEM, Actor
from tests.conftest import make_client
from tests.registry.cards import card_03
from tests.services_helpers import actor_of, holding_row


def _register(actor: Actor, *agent_ids: str) -> None:
    for agent_id in agent_ids:
        services.agent_register(actor=actor, agent_id=agent_id, card=card_03())


def _ttl(agent: Agent) -> int:
    """The lease's length (SQLite computes it to the millisecond)."""
    return round((agent.expires_at - agent.last_seen).total_seconds())


@pytest.mark.django_db(transaction=True)
def test_a_batch_renews_each_lease_under_its_own_owner_check():
    owner, _ = make_client(["register"], name="owner")
    other, _ = make_client(["register"], name="other")
    caller, no_scope = actor_of(owner), actor_of(make_client(["call"], name="caller")[0])
    _register(actor_of(owner), "mine-1", "mine-2", "lapsed")
    _register(actor_of(other), "theirs", "theirs-2")
    _register(SYSTEM, "unowned")
    past = timezone.now() - timedelta(seconds=5)
    Agent.objects.filter(agent_id="lapsed").update(expires_at=past, routing_changed_at=past)
    before = {a.agent_id: a for a in Agent.objects.all()}

    beats = [(caller, "mine-1"), (caller, "theirs"), (caller, "ghost"), (no_scope, "mine-2"),
             (caller, "mine-2"), (caller, "mine-2"), (SYSTEM, "theirs-2"), (caller, "lapsed"),
             (caller, "unowned"), (SYSTEM, "theirs")]
    with CaptureQueriesContext(connection) as queries:
        results = services.agents_heartbeat(beats=beats)

    renewed = [r.agent_id if r else None for r in results]
    # theirs (another owner's), ghost (unknown), a caller without the scope and an unowned agent
    # are left to the single path, which answers 403 or 404 for them; so is an id the batch
    # holds for another owner (the admin's theirs), renewed there. The second mine-2 of the
    # same owner shares the first's renewal.
    assert renewed == ["mine-1", None, None, None, "mine-2", "mine-2", "theirs-2", "lapsed",
                       None, None]
    after = {a.agent_id: a for a in Agent.objects.all()}
    for agent_id in ("mine-1", "mine-2", "theirs-2", "lapsed"):
        assert after[agent_id].expires_at > before[agent_id].expires_at
        assert _ttl(after[agent_id]) == 90
    for agent_id in ("unowned", "theirs"):
        assert after[agent_id].expires_at == before[agent_id].expires_at
    # Only the lapsed lease moves the routing marker (nodes re-read that agent).
    assert after["lapsed"].routing_changed_at > before["lapsed"].routing_changed_at
    assert after["mine-1"].routing_changed_at == before["mine-1"].routing_changed_at
    stamps = {r.last_seen for r in results if r}
    assert len(stamps) == 1  # one batch, one instant
    if connection.vendor == "postgresql":
        assert len(queries) == 1, [q["sql"] for q in queries]
    else:  # SQLite: one transaction, a statement each
        assert [q["sql"] for q in queries][0].startswith("BEGIN")


def _beat(base: str, token: str, agent_id: str) -> httpx.Response:
    auth = {"Authorization": f"Bearer {token}"}
    if agent_id.startswith("kube:"):
        return httpx.post(f"{base}/agents/heartbeat", headers=auth,
                          json={"agent_id": agent_id[5:]}, timeout=60)
    return httpx.post(f"{base}/api/v1/agents/{agent_id}/heartbeat", headers=auth, timeout=60)


@pytest.fixture
def fleet(transactional_db):
    owner, owner_token = make_client(["register"], name="fleet-owner")
    other, other_token = make_client(["register"], name="fleet-other")
    _register(actor_of(owner), "held", *(f"fleet-{i}" for i in range(40)))
    _register(actor_of(other), "foreign")
    return owner_token, other_token


def _renewals():
    """The running node's heartbeat coalescer (one per event loop), observed, never driven."""
    from gateway import runtime
    from node import heartbeats

    return heartbeats._renewals.on(runtime.current_node().loop)


def _wait_until(predicate, what: str, timeout: float = 60.0) -> None:
    """Wait on the node's state, however slow the machine (bounded; no fixed sleeps)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.01)


def _held_batch_running(held) -> bool:
    """The first heartbeat's batch is taken and writing (so blocked on the held row)."""
    renewals = _renewals()
    return renewals is not None and renewals.running == 1 and renewals.waiting == 0 \
        and not held.done()


def test_heartbeats_waiting_on_a_batch_are_written_in_the_next_one(live_server_url, fleet):
    """A running node: the first heartbeat's batch is held by a lock on its row; the 40
    heartbeats sent meanwhile (each on its own connection, mixed with unknown and foreign
    ids) wait and are all renewed by the next batch, at one instant, while the unknown and
    foreign ones still get their own 404 and 403."""
    owner_token, _ = fleet

    def beat(agent_id: str) -> httpx.Response:
        return _beat(live_server_url, owner_token, agent_id)

    others = [f"fleet-{i}" for i in range(20)] + [f"kube:fleet-{i}" for i in range(20, 40)]
    others += ["ghost", "foreign", "kube:ghost", "kube:foreign", "kube:Not an id!"]
    with ThreadPoolExecutor(len(others) + 1) as pool:
        with holding_row("held"):
            held = pool.submit(beat, "held")
            _wait_until(lambda: _held_batch_running(held), "the held batch writing")
            futures = {agent_id: pool.submit(beat, agent_id) for agent_id in others}
            # Every heartbeat with an id reaches the node and waits for the writer; the
            # malformed body is answered before any batch.
            _wait_until(lambda: _renewals().waiting == len(others) - 1,
                        "44 heartbeats waiting for the next batch")
            _wait_until(lambda: futures["kube:Not an id!"].done(), "the malformed one answered")
            assert not held.done()
            assert [a for a, f in futures.items() if f.done()] == ["kube:Not an id!"]
        answers = {agent_id: f.result() for agent_id, f in futures.items()}
        assert held.result().status_code == 200

    statuses = {agent_id: r.status_code for agent_id, r in answers.items()}
    assert statuses == {**{a: 200 for a in others[:40]}, "ghost": 404, "foreign": 403,
                        "kube:ghost": 400, "kube:foreign": 403, "kube:Not an id!": 400}
    v1_stamps = {answers[a].json()["last_seen"] for a in others[:20]}
    kube_stamps = {answers[a].json()["last_seen"] for a in others[20:40]}
    assert len(v1_stamps) == 1 and len(kube_stamps) == 1  # one batch: one instant
    assert [_ttl(a) for a in Agent.objects.filter(agent_id__startswith="fleet-")] == [90] * 40
    assert len({a.last_seen for a in Agent.objects.filter(agent_id__startswith="fleet-")}) == 1


def test_heartbeats_past_the_waiting_bound_are_refused_at_once(live_server_url, fleet,
                                                               monkeypatch):
    """The queue of heartbeats waiting for the writer is bounded: with the first batch held
    and room for 3, the other 7 of 10 get a 503 with ``Retry-After`` at once, and the 3 that
    waited are renewed once the batch goes through."""
    from node import heartbeats

    monkeypatch.setattr(heartbeats, "MAX_WAITING", 3)  # read when the node's queue is made
    owner_token, _ = fleet
    with ThreadPoolExecutor(12) as pool:
        with holding_row("held"):
            held = pool.submit(_beat, live_server_url, owner_token, "held")
            _wait_until(lambda: _held_batch_running(held), "the held batch writing")
            futures = [pool.submit(_beat, live_server_url, owner_token, f"fleet-{i}")
                       for i in range(10)]
            # Room for 3: those wait for the writer, the other 7 are answered at once.
            _wait_until(lambda: _renewals().waiting == 3
                        and sum(f.done() for f in futures) == 7, "3 waiting and 7 refused")
            assert not held.done()
            refused = [f.result() for f in futures if f.done()]
            assert [r.status_code for r in refused] == [503] * 7
            assert {r.headers["retry-after"] for r in refused} == {"1"}
            assert refused[0].json() == {
                "error": "this node has too many heartbeats waiting; retry"}
        statuses = sorted(f.result().status_code for f in futures)
    assert held.result().status_code == 200
    assert statuses == [200] * 3 + [503] * 7


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin"])
def test_the_heartbeat_answer_is_the_documented_serializers(settings, zone):
    """The answer is built without a serializer per heartbeat: it must stay what
    ``HeartbeatOutput`` (the schema in the OpenAPI document) gives, in any time zone."""
    from registry.api.serializers import HeartbeatOutput
    from registry.api.views import v1_heartbeat_answer

    settings.TIME_ZONE = zone
    now = timezone.now()
    beat = services.HeartbeatResult("a-1", now, now + timedelta(seconds=90, microseconds=7))
    assert v1_heartbeat_answer(beat) == (200, dict(HeartbeatOutput(beat).data))
