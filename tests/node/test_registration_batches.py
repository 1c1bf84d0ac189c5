"""Registrations arriving together on a node are written together (group commit,
node.registrations): each still gets its own answer -- its own refusal too -- and every
agent written is in the registry, the node's routing table and the search index.

A registration whose card the node must fetch from a slow server holds the node's batch
writer; the registrations sent meanwhile queue and are written as the next batch.

The tests wait on the node's state (its registration coalescer's batches and queue, observed)
and on the card server's requests, never on fixed sleeps: a loaded machine only makes them
slower."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import httpx
import orjson
import pytest

from ard.models import AgentDoc
from gateway import runtime
from node import registrations
from registry import services
from registry.models import Agent, CardVersion
from tests.conftest import make_client
from tests.discovery.servers import CardServer
from tests.registry.cards import card_03, card_kubemq
from tests.servers import serve_app
from tests.services_helpers import actor_of, eventually, holding_row

V1 = "/api/v1/agents"
KUBEMQ = "/agents/register"


def _batches():
    """The running node's registration coalescer (one per event loop), observed."""
    return registrations._batches.on(runtime.current_node().loop)


async def _until(predicate, what: str, timeout: float = 60.0) -> None:
    """Wait on the node's state (bounded), however slow the machine."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.01)


async def _hold_every_writer(post) -> list[asyncio.Future]:
    """Re-registrations of "owned" (its row held by the caller) until each of the node's batch
    writers is writing one, blocked on the row; nothing left waiting."""
    holders = []
    for index in range(registrations.MAX_RUNNING):  # one batch each, one at a time
        holders.append(asyncio.ensure_future(post(*_v1("owned"))))
        await _until(lambda n=index + 1: (b := _batches()) is not None and b.running == n
                     and b.waiting == 0, f"{index + 1} batch writer(s) holding")
    assert not any(holder.done() for holder in holders)
    return holders


@pytest.fixture
def tokens(transactional_db, settings):
    settings.A2A_MAX_AGENTS_PER_CLIENT = 3 + registrations.MAX_RUNNING
    owner, owner_token = make_client(["register"], name="owner")
    _, caller_token = make_client(["call"], name="caller")
    full, full_token = make_client(["register"], name="full")
    roomy, roomy_token = make_client(["register"], name="roomy")
    services.agent_register(actor=actor_of(owner), agent_id="owned", card=card_03())
    for index in range(registrations.MAX_RUNNING):  # room left for three
        services.agent_register(actor=actor_of(roomy), agent_id=f"roomy-old-{index}",
                                card=card_03())
    for index in range(3 + registrations.MAX_RUNNING):
        services.agent_register(actor=actor_of(full), agent_id=f"full-{index}", card=card_03())
    return {"owner": owner_token, "caller": caller_token, "full": full_token,
            "roomy": roomy_token}


@pytest.fixture
def slow_card():
    """A card server whose card arrives only once the test opens its gate: (app, base URL)."""
    app = CardServer()
    gate = app.gates["/slow"] = threading.Event()
    with serve_app(app, lifespan="off") as server:
        app.url = server.url
        app.set_card("/slow", card_03("http://127.0.0.1:9/"))
        try:
            yield app, app.base("/slow")
        finally:
            gate.set()


def _v1(agent_id: str, **card) -> tuple[str, bytes]:
    return V1, orjson.dumps({"agent_id": agent_id, "card": card_03(**card)})


def _kubemq(agent_id: str) -> tuple[str, bytes]:
    return KUBEMQ, orjson.dumps(card_kubemq(agent_id))


def _batch_metrics(base: str) -> tuple[float, float]:
    text = httpx.get(base + "/metrics", timeout=10).text
    batches = re.search(r"^kubemq_a2a_registration_batches_total (\S+)$", text, re.M)
    items = re.search(r"^kubemq_a2a_registration_batch_items_total (\S+)$", text, re.M)
    return float(batches.group(1)), float(items.group(1))


def _together(base: str, token: str,
              requests: list[tuple[str, bytes, str]]) -> list[httpx.Response]:
    """Send ``requests`` (path, body, token) at once while re-registrations of the owner's
    "owned", its row held by the test, hold each of the node's batch writers, so they queue
    into one batch; their answers, in order."""
    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            def post(path: str, body: bytes, bearer: str):
                return client.post(path, content=body, headers={
                    "Content-Type": "application/json", "Authorization": f"Bearer {bearer}"})

            with holding_row("owned") as release:
                holders = await _hold_every_writer(lambda path, body: post(path, body, token))
                pending = [asyncio.ensure_future(post(*r)) for r in requests]
                # All reach the node: each answered before any batch, or queued for the next.
                await _until(lambda: _batches().waiting + sum(p.done() for p in pending)
                             == len(pending), "every registration answered or queued")
                release()
                answers = await asyncio.gather(*pending)
            for holder in holders:
                held = await holder
                assert held.status_code == 200, held.text  # "owned" renewed
            return answers

    return asyncio.run(run())


def test_concurrent_registrations_are_written_together_and_all_answered(
        live_server_url, tokens, settings):
    settings.A2A_MAX_AGENTS_PER_CLIENT = 100
    owner = tokens["owner"]
    ids = [f"many-{index:02d}" for index in range(40)]
    requests = [(*(_v1(agent_id) if index % 2 else _kubemq(agent_id)), owner)
                for index, agent_id in enumerate(ids)]
    batches_before, items_before = _batch_metrics(live_server_url)
    answers = _together(live_server_url, tokens["owner"], requests)
    batches_after, items_after = _batch_metrics(live_server_url)
    for agent_id, (path, _, _), answer in zip(ids, requests, answers, strict=True):
        assert answer.status_code == (201 if path == V1 else 200), answer.text
        assert answer.json()["agent_id"] == agent_id
    holders = registrations.MAX_RUNNING
    assert items_after - items_before == len(ids) + holders
    assert batches_after - batches_before == holders + 1  # the holders', then all 40 together
    agents = Agent.objects.filter(agent_id__in=ids)
    assert sorted(agents.values_list("agent_id", flat=True)) == ids
    assert {a.owner.name for a in agents.select_related("owner")} == {"owner"}
    assert CardVersion.objects.filter(agent__agent_id__in=ids).count() == len(ids)
    # The registered events reached the node's routing table and the search index.
    node = runtime.current_node()
    assert node is not None
    assert eventually(lambda: all(agent_id in node.table for agent_id in ids))
    assert eventually(
        lambda: AgentDoc.objects.filter(agent_id__in=ids, active=True).count() == len(ids))


def test_a_refused_registration_in_a_batch_gets_its_own_answer(live_server_url, tokens,
                                                               settings):
    settings.A2A_MAX_AGENTS_PER_CLIENT = 3 + registrations.MAX_RUNNING
    # "full" is full; "roomy" has room for three of its four new ones.
    owner, roomy = tokens["owner"], tokens["roomy"]
    requests = [
        (*_v1("good-1"), owner),
        (*_v1("bad-card", url="http://169.254.169.254/"), owner),  # URL check
        (*_v1("no-scope"), tokens["caller"]),  # no register scope
        (*_v1("owned", name="Taken"), roomy),  # another client's agent
        (*_v1("one-more"), tokens["full"]),  # over its quota
        (*_kubemq("good-2"), owner),
        (KUBEMQ, b'{"agent_id": "no-name", "url": "http://127.0.0.1:9/"}', owner),
        (*_v1("roomy-1"), roomy),  # room for three: the fourth in the batch is refused
        (*_v1("roomy-2"), roomy),
        (*_v1("roomy-3"), roomy),
        (*_v1("roomy-4"), roomy),
    ]
    answers = _together(live_server_url, tokens["owner"], requests)
    got = {orjson.loads(r[1]).get("agent_id"): (a.status_code, a.json())
           for r, a in zip(requests, answers, strict=True)}
    assert got["good-1"][0] == 201 and got["good-2"][0] == 200
    assert got["bad-card"] == (400, {"error": got["bad-card"][1]["error"]})
    assert "card endpoint" in got["bad-card"][1]["error"]
    assert got["no-scope"] == (403, {"error": "this client lacks the register scope"})
    assert got["owned"] == (403, {"error": "owned belongs to another client"})
    assert got["one-more"][0] == 403 and "agent quota reached" in got["one-more"][1]["error"]
    assert got["no-name"][0] == 400 and "name" in got["no-name"][1]["error"]
    roomy_statuses = sorted(got[f"roomy-{i}"][0] for i in range(1, 5))
    assert roomy_statuses == [201, 201, 201, 403]
    assert sorted(Agent.objects.filter(agent_id__regex=r"^roomy-\d$")
                  .values_list("agent_id", flat=True)) == sorted(
        f"roomy-{i}" for i in range(1, 5) if got[f"roomy-{i}"][0] == 201)
    assert set(Agent.objects.values_list("agent_id", flat=True)) >= {"good-1", "good-2"}
    for refused in ("bad-card", "no-scope", "one-more", "no-name"):
        assert not Agent.objects.filter(agent_id=refused).exists()
    assert Agent.objects.get(agent_id="owned").name == "Echo Agent"  # not the refused "Taken"


def test_the_same_agent_twice_in_a_batch(live_server_url, tokens, settings):
    settings.A2A_MAX_AGENTS_PER_CLIENT = 100
    owner = tokens["owner"]
    requests = [(*_v1("twice", name="Alpha"), owner), (*_v1("twice", name="Beta"), owner)]
    answers = _together(live_server_url, tokens["owner"], requests)
    assert sorted(a.status_code for a in answers) == [200, 201], [a.text for a in answers]
    (renewal,) = [a for a in answers if a.status_code == 200]
    agent = Agent.objects.get(agent_id="twice")
    assert agent.name == renewal.json()["name"]  # the one written second is the row now
    assert CardVersion.objects.filter(agent=agent).count() == 2
    assert eventually(lambda: AgentDoc.objects.filter(
        agent_id="twice", card_sha256=agent.card_sha256).exists())


def test_a_card_slow_to_fetch_holds_no_other_registration(live_server_url, tokens, slow_card,
                                                          settings):
    """A registration by URL fetches its card in a thread of its own: more of them than the
    node has batch writers, each held by a slow (or hostile) agent, delay no registration
    with a card sent meanwhile."""
    settings.A2A_MAX_AGENTS_PER_CLIENT = 100
    owner = tokens["owner"]

    async def run() -> tuple[list[httpx.Response], list[httpx.Response], bool]:
        async with httpx.AsyncClient(base_url=live_server_url, timeout=30) as client:
            def post(path: str, body: bytes):
                return client.post(path, content=body, headers={
                    "Content-Type": "application/json", "Authorization": f"Bearer {owner}"})

            slow = [asyncio.ensure_future(post(V1, orjson.dumps(
                {"agent_id": f"slow-{index}", "url": url})))
                for index in range(registrations.MAX_RUNNING + 1)]
            # Every slow card is being fetched (the server holds each request at its gate).
            await _until(lambda: app.count("/slow") == registrations.MAX_RUNNING + 1,
                         "every slow card requested")
            quick = await asyncio.gather(post(*_v1("quick-1")), post(*_kubemq("quick-2")))
            still_fetching = not any(task.done() for task in slow)
            app.gates["/slow"].set()
            return quick, await asyncio.gather(*slow), still_fetching

    app, url = slow_card
    quick, slow, still_fetching = asyncio.run(run())
    assert [r.status_code for r in quick] == [201, 200]
    assert still_fetching  # answered while every slow card was still on its way
    assert [r.status_code for r in slow] == [201] * (registrations.MAX_RUNNING + 1)


def test_registrations_past_the_waiting_bound_are_refused_at_once(live_server_url, tokens,
                                                                  settings, monkeypatch):
    """The queue of registrations waiting for a batch writer is bounded: with every writer
    held and room for 3, the other 7 of 10 get a JSON 503 with ``Retry-After`` at once (no
    agent written), and the 3 that waited are registered once the writers are free."""
    monkeypatch.setattr(registrations, "MAX_WAITING", 3)  # read when the node's queue is made
    settings.A2A_MAX_AGENTS_PER_CLIENT = 100
    owner = tokens["owner"]
    ids = [f"queued-{index}" for index in range(10)]

    async def run() -> tuple[list[httpx.Response], list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=live_server_url, timeout=30) as client:
            def post(path: str, body: bytes):
                return client.post(path, content=body, headers={
                    "Content-Type": "application/json", "Authorization": f"Bearer {owner}"})

            with holding_row("owned") as release:
                holders = await _hold_every_writer(post)  # every writer held
                pending = [asyncio.ensure_future(post(*_v1(agent_id))) for agent_id in ids]
                # Room for 3: those wait for a writer, the other 7 are answered at once.
                await _until(lambda: _batches().waiting == 3
                             and sum(task.done() for task in pending) == 7,
                             "3 waiting and 7 refused")
                refused = [task.result() for task in pending if task.done()]
                assert not any(holder.done() for holder in holders)
                release()
                await asyncio.gather(*holders)
                return refused, await asyncio.gather(*pending)

    refused, answers = asyncio.run(run())
    assert [r.status_code for r in refused] == [503] * 7  # answered while the writers were held
    assert {r.headers["retry-after"] for r in refused} == {"1"}
    assert {r.text for r in refused} == {
        '{"error":"this node has too many registrations waiting; retry"}'}
    assert sorted(a.status_code for a in answers) == [201] * 3 + [503] * 7
    written = sorted(agent_id for agent_id, a in zip(ids, answers, strict=True)
                     if a.status_code == 201)
    assert sorted(Agent.objects.filter(agent_id__startswith="queued-")
                  .values_list("agent_id", flat=True)) == written
