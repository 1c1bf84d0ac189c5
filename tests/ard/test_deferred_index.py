"""The search documents of registrations written together are written by the node's index
writer after the registrations are answered (ard.indexer.DeferredWriter): in order, bounded,
visible to a search on the node at once, and repaired when a process died with some.

The writer is held up the real way: another connection locks the index table, so its INSERT
waits (reads go on)."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import httpx
import pytest
from django.conf import settings
from django.db import connection

from ard import indexer
from ard.models import AgentDoc
from ard.tasks import index_repair_task
from registry import services
from registry.models import Agent
from registry.permissions import SYSTEM
from tests.registry.cards import card_03
from tests.services_helpers import holding

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("registrations are written together (and their documents deferred) on "
                    "PostgreSQL; SQLite writes them one by one with their documents")


def index_locked():
    """Lock ``ard_agentdoc`` against writes from another connection until the block ends or
    the ``release()`` it yields is called (reads go on)."""
    def lock() -> None:
        with connection.cursor() as cursor:
            cursor.execute("LOCK TABLE ard_agentdoc IN SHARE ROW EXCLUSIVE MODE")

    return holding(lock)


def _regs(ids: list[str]) -> list[services.Registration]:
    return [services.registration(actor=SYSTEM, agent_id=agent_id, ttl_seconds=600,
                                  card=card_03(name=f"Deferred {agent_id}")) for agent_id in ids]


def _docs(prefix: str) -> set[str]:
    return set(AgentDoc.objects.filter(agent_id__startswith=prefix)
               .values_list("agent_id", flat=True))


def _register_together(base: str, token: str, ids: list[str], word: str) -> list[int]:
    """Register ``ids`` (public, ``word`` in their names) through the API all at once, so the
    node writes them together; their answers' status codes."""
    async def register_all() -> list[int]:
        async with httpx.AsyncClient(base_url=base, timeout=30,
                                     headers={"Authorization": f"Bearer {token}"}) as api:
            answers = await asyncio.gather(*(api.post("/api/v1/agents", json={
                "agent_id": agent_id, "public": True, "ttl_seconds": 600,
                "card": card_03(name=f"{word} {agent_id}")}) for agent_id in ids))
        return [answer.status_code for answer in answers]

    return asyncio.run(register_all())


def _in_thread(fn) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()

    def run() -> None:
        try:
            fn()
        finally:
            connection.close()
            done.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, done


def test_documents_are_written_after_the_registrations_are_answered(postgres_only):
    with index_locked() as release:
        results = services.agents_register(_regs(["d-1", "d-2", "d-3"]))
        assert [created for _, created in results] == [True, True, True]  # answered
        assert Agent.objects.filter(agent_id__startswith="d-").count() == 3
        assert indexer.writer().deferred("d-2")
        assert _docs("d-") == set()  # the writer waits for the lock; the batch did not
        started = time.monotonic()
        assert not indexer.writer().settle(0.3)  # a wait for it is bounded
        assert time.monotonic() - started < 2
        release()
    assert indexer.writer().settle(30)
    assert _docs("d-") == {"d-1", "d-2", "d-3"}
    agent = Agent.objects.get(agent_id="d-2")
    doc = AgentDoc.objects.get(agent_id="d-2")
    assert (doc.registry_agent_id, doc.card_sha256, doc.name) == (
        agent.pk, agent.card_sha256, "Deferred d-2")


def _cut_the_writers_connection(cut: set[int]) -> None:
    """Terminate the server process of the index writer's connection, blocked on the lock
    (to the writer: the database went away mid-statement). ``cut`` holds the processes cut
    before: one terminated is listed until it has exited, and cutting it again would leave
    the writer's next attempt waiting for the lock instead."""
    sql = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
           "AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO \"ard_agentdoc\"%%'")
    deadline = time.monotonic() + 10
    with connection.cursor() as cursor:
        while True:
            cursor.execute(sql)
            pids = [pid for (pid,) in cursor.fetchall() if pid not in cut]
            if pids or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert len(pids) == 1, pids
        cursor.execute("SELECT pg_terminate_backend(%s)", [pids[0]])
    cut.add(pids[0])


def test_the_writer_retries_a_database_outage(postgres_only, monkeypatch):
    # The process's writer done first: its connection must not be the one blocked and cut.
    assert indexer.writer().settle(30)
    quick = indexer.DeferredWriter(retry_seconds=(0.05, 0.05))
    monkeypatch.setattr(indexer, "_writer", quick)
    with index_locked() as release:
        services.agents_register(_regs(["r-1", "r-2"]))
        cut: set[int] = set()
        _cut_the_writers_connection(cut)  # the first attempt fails: it tries again, reconnected
        _cut_the_writers_connection(cut)  # so does the second
        release()
    assert quick.settle(30)
    assert (quick.written, quick.given_up) == (2, 0)
    assert _docs("r-") == {"r-1", "r-2"}


def test_past_its_retries_the_writer_leaves_the_documents_to_the_repair_job(
        postgres_only, monkeypatch):
    # The process's writer done first: its connection must not be the one blocked and cut.
    assert indexer.writer().settle(30)
    quick = indexer.DeferredWriter(retry_seconds=(0.05,))
    monkeypatch.setattr(indexer, "_writer", quick)
    with index_locked():
        services.agents_register(_regs(["g-1", "g-2", "g-3"]))
        cut: set[int] = set()
        _cut_the_writers_connection(cut)
        _cut_the_writers_connection(cut)  # its last attempt: given up, not retried forever
        assert quick.settle(20)  # well inside the lock's 30 s: given up, not let through
        assert (quick.written, quick.given_up) == (0, 3)
    assert _docs("g-") == set()
    assert index_repair_task.apply().get() == 3
    assert _docs("g-") == {"g-1", "g-2", "g-3"}


def test_a_later_change_waits_for_the_agents_deferred_document(postgres_only):
    """A deregistration right after the registration: its document never lands after it."""
    with index_locked() as release:
        services.agents_register(_regs(["o-1", "o-2"]))
        thread, done = _in_thread(
            lambda: services.agent_deregister(actor=SYSTEM, agent_id="o-1"))
        assert not done.wait(0.5)  # its event waits for o-1's document first
        assert not Agent.objects.filter(agent_id="o-1").exists()  # the row is gone already
        release()
    assert done.wait(10)
    thread.join()
    assert _docs("o-") == {"o-2"}


@pytest.mark.parametrize("bound", ["agents", "bytes"])
def test_past_its_bound_a_batch_writes_its_own_documents(postgres_only, monkeypatch, bound):
    first = _regs(["b-1", "b-2", "b-3"])
    card_bytes = sum(len(reg.parsed.raw) for reg in first)
    small = (indexer.DeferredWriter(max_agents=3) if bound == "agents"
             else indexer.DeferredWriter(max_bytes=card_bytes))
    monkeypatch.setattr(indexer, "_writer", small)
    with index_locked() as release:
        services.agents_register(first)
        assert small.deferred("b-3")
        thread, done = _in_thread(lambda: services.agents_register(_regs(["b-4", "b-5"])))
        # Not deferred: the batch writes its documents itself, so it waits for the lock.
        assert not done.wait(0.5)
        assert not small.deferred("b-4")
        release()
    assert done.wait(10)
    thread.join()
    assert small.settle(30)
    assert _docs("b-") == {"b-1", "b-2", "b-3", "b-4", "b-5"}


def test_the_repair_job_writes_missing_and_stale_documents():
    for agent_id in ("r-1", "r-2", "r-3"):
        services.agent_register(actor=SYSTEM, agent_id=agent_id, card=card_03(name=agent_id))
    assert _docs("r-") == {"r-1", "r-2", "r-3"}
    AgentDoc.objects.filter(agent_id="r-1").delete()  # a node died with it deferred
    AgentDoc.objects.filter(agent_id="r-2").update(card_sha256="0" * 64, name="old")
    # Scheduled (beat, and every serving node under the cluster-wide lock).
    assert settings.CELERY_BEAT_SCHEDULE["ard-index-repair"]["task"] == index_repair_task.name
    assert "ard-index-repair" in settings.A2A_NODE_PERIODIC_TASKS
    assert index_repair_task.apply().get() == 2
    for agent_id in ("r-1", "r-2"):
        agent, doc = Agent.objects.get(agent_id=agent_id), AgentDoc.objects.get(agent_id=agent_id)
        assert (doc.registry_agent_id, doc.card_sha256, doc.name) == (
            agent.pk, agent.card_sha256, agent_id)
    assert index_repair_task.apply().get() == 0  # nothing left to repair


def test_a_search_right_after_registrations_written_together_finds_them(live_server_url,
                                                                         admin_token):
    """Read your writes on the node: its ARD requests wait for its deferred documents."""
    ids = [f"finch-{index:02d}" for index in range(24)]

    assert _register_together(live_server_url, admin_token, ids, "Zebrafinch") == \
        [201] * len(ids)
    resp = httpx.post(f"{live_server_url}/ard/v1/search", timeout=10,
                      json={"query": {"text": "zebrafinch"}, "pageSize": 100})
    assert resp.status_code == 200, resp.text
    found = sorted(r["metadata"]["agentId"] for r in resp.json()["results"])
    assert found == ids


def test_registrations_are_answered_while_the_index_cannot_be_written(
        postgres_only, live_server_url, admin_token, monkeypatch):
    """The index table locked: registrations written together are still answered at once; a
    search on the node waits for their documents at most SETTLE_TIMEOUT_SECONDS, then answers
    with what is written; once the lock goes, the documents land."""
    monkeypatch.setattr(indexer, "SETTLE_TIMEOUT_SECONDS", 1.0)
    ids = [f"held-{index:02d}" for index in range(12)]

    search = {"query": {"text": "heldback"}, "pageSize": 100}
    with index_locked() as release:
        started = time.monotonic()
        assert _register_together(live_server_url, admin_token, ids, "Heldback") == \
            [201] * len(ids)
        assert time.monotonic() - started < 5
        assert indexer.writer().deferred()
        started = time.monotonic()
        resp = httpx.post(f"{live_server_url}/ard/v1/search", json=search, timeout=10)
        waited = time.monotonic() - started
        assert resp.status_code == 200, resp.text
        assert 0.9 <= waited < 4  # the bounded wait, then an answer
        assert resp.json()["results"] == []  # nothing written yet
        assert _metric(live_server_url, "kubemq_a2a_ard_index_deferred") == len(ids)
        written = _metric(live_server_url, "kubemq_a2a_ard_index_written_total")
        release()
    resp = httpx.post(f"{live_server_url}/ard/v1/search", json=search, timeout=10)
    assert sorted(r["metadata"]["agentId"] for r in resp.json()["results"]) == ids
    assert _metric(live_server_url, "kubemq_a2a_ard_index_deferred") == 0
    assert _metric(live_server_url, "kubemq_a2a_ard_index_written_total") == written + len(ids)


def _metric(base: str, name: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    assert match, name
    return float(match.group(1))
