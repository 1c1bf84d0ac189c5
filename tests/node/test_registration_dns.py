"""The registration URL check resolves agent host names with a bounded wait, before a
registration joins a batch (registry.netcheck, node.registrations): a registrant whose name
server answers slowly, or never, delays only its own registration -- never the batch written
with it, nor other registrations.

The machine's resolver cannot be pointed at a slow name server from a test, so the process's
``socket.getaddrinfo`` answers names under ``.slow.test`` after ``LOOKUP_SECONDS`` (and
``meta.slow.test`` at once, with a cloud-metadata address); everything else it passes on."""

from __future__ import annotations

import asyncio
import socket
import threading

import httpx
import orjson
import pytest

from core import threads
from node import registrations
from registry import netcheck
from registry.models import Agent
from tests.conftest import make_client
from tests.registry.cards import card_03

LOOKUP_SECONDS = 5.0
CHECK_WAITS = 2.0  # A2A_URL_CHECK_DNS_TIMEOUT_SECONDS in these tests
V1 = "/api/v1/agents"


class SlowNames:
    def __init__(self) -> None:
        self.under_way = 0
        self.lock = threading.Lock()
        self.real = socket.getaddrinfo

    def __call__(self, host, *args, **kwargs):
        if isinstance(host, str) and host.endswith(".slow.test"):
            if host == "meta.slow.test":
                return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", 0))]
            with self.lock:
                self.under_way += 1
            try:
                threading.Event().wait(LOOKUP_SECONDS)
                raise socket.gaierror(socket.EAI_AGAIN, "name server did not answer")
            finally:
                with self.lock:
                    self.under_way -= 1
        return self.real(host, *args, **kwargs)


@pytest.fixture
def slow_names(monkeypatch, settings):
    settings.A2A_URL_CHECK_DNS_TIMEOUT_SECONDS = CHECK_WAITS
    monkeypatch.setattr(netcheck, "_resolve_cache", {})
    monkeypatch.setattr(netcheck, "_lookups", {})
    threads.discard("url-check-dns")  # a pool of its own, dropped afterwards
    names = SlowNames()
    monkeypatch.setattr(socket, "getaddrinfo", names)
    yield names
    threads.discard("url-check-dns")  # lookups still queued are dropped; running ones end soon


def test_a_slow_name_server_delays_only_its_own_registration(live_server_url, slow_names,
                                                              transactional_db):
    _, token = make_client(["register"], name="dns")
    slow_count = 4 * registrations.MAX_RUNNING  # enough to hold every batch writer

    async def run():
        loop = asyncio.get_running_loop()
        began = loop.time()
        async with httpx.AsyncClient(base_url=live_server_url, timeout=60) as client:
            async def post(agent_id: str, url: str) -> tuple[httpx.Response, float]:
                response = await client.post(V1, content=orjson.dumps(
                    {"agent_id": agent_id, "card": card_03(url)}), headers={
                    "Content-Type": "application/json", "Authorization": f"Bearer {token}"})
                return response, loop.time()

            slow = [asyncio.ensure_future(post(f"slow-{i}", f"http://agent-{i}.slow.test/"))
                    for i in range(slow_count)]
            await asyncio.sleep(0.2)
            quick = await asyncio.gather(*(post(f"quick-{i}", "http://127.0.0.1:9/")
                                           for i in range(4)))
            slow_answers = await asyncio.gather(*slow)
            return quick, slow_answers, slow_names.under_way, began

    quick, slow, slow_under_way, began = asyncio.run(run())
    assert [r.status_code for r, _ in quick] == [201] * 4
    # The quick registrations were answered before any slow one: none waited behind a
    # registration whose name server had not answered.
    assert max(at for _, at in quick) < min(at for _, at in slow)
    # Each slow registration waited its bounded lookup, then counted the name as not
    # resolving now (accepted: every outbound connection checks the address again) --
    # answered while the lookups themselves were still under way, not after them.
    assert [r.status_code for r, _ in slow] == [201] * slow_count, {
        r.text for r, _ in slow if r.status_code != 201}
    assert slow_under_way > 0
    assert min(at for _, at in slow) - began >= CHECK_WAITS
    assert Agent.objects.filter(agent_id__startswith="slow-").count() == slow_count

def test_a_name_resolving_to_a_refused_address_is_still_refused(live_server_url, slow_names,
                                                                transactional_db):
    _, token = make_client(["register"], name="dns-refused")
    response = httpx.post(live_server_url + V1, content=orjson.dumps(
        {"agent_id": "metadata-by-name", "card": card_03("http://meta.slow.test/")}),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        timeout=30)
    assert response.status_code == 400, response.text
    assert "resolves to a refused address" in response.json()["error"]
    assert not Agent.objects.filter(agent_id="metadata-by-name").exists()


def test_the_check_itself_waits_a_bounded_time(slow_names):
    """Outside the node's fast path (the DRF view, the admin, discovery) the check's own
    lookup is bounded the same way."""
    started = threading.Event()
    done: list[str] = []

    def check() -> None:
        started.set()
        done.append(netcheck.check_agent_url("http://lonely.slow.test/"))

    thread = threading.Thread(target=check)
    thread.start()
    assert started.wait(5)
    thread.join(LOOKUP_SECONDS - 1)  # well before the name server would answer
    assert done == ["http://lonely.slow.test/"]
    assert slow_names.under_way == 1  # the lookup still runs, in a thread of its own


def test_lookups_at_once_are_bounded(slow_names, monkeypatch):
    """Past ``MAX_LOOKUPS`` names under way, a new name is not queued behind them: it counts
    as not resolving now, at once (the connect-time check still applies)."""
    monkeypatch.setattr(netcheck, "MAX_LOOKUPS", 2)
    assert netcheck.lookup("a.slow.test") is not None
    assert netcheck.lookup("b.slow.test") is not None
    assert netcheck.lookup("a.slow.test") is netcheck.lookup("a.slow.test")  # one per name
    assert netcheck.lookup("c.slow.test") is None
    result: list[str] = []
    thread = threading.Thread(target=lambda: result.append(
        netcheck.check_agent_url("http://c.slow.test/")))
    thread.start()
    thread.join(CHECK_WAITS / 2)  # answered without waiting for a lookup of its own
    assert result == ["http://c.slow.test/"]
    assert netcheck.cached_addresses("c.slow.test") == ()
