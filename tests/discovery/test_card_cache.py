"""The card cache against a real card server on loopback: conditional GET, lifetimes, change by
hash, stale-on-error with backoff, single-flight across threads and (with Redis) workers."""

from __future__ import annotations

import threading

import pytest

from core.locks import LocalLocks, RedisLocks
from discovery.card_cache import CardCache, CardFetchFailed, Outcome
from discovery.card_http import backoff_seconds, cache_lifetime
from discovery.models import CardCacheEntry
from tests.discovery.servers import WELL_KNOWN, make_card, skill

pytestmark = pytest.mark.django_db


def _url(server, prefix: str) -> str:
    return server.url + prefix + WELL_KNOWN


def _publish(server, prefix: str, *tags: str) -> None:
    server.set_card(prefix, make_card(prefix, server.base(prefix), [skill("s", *tags)]))


def test_304_keeps_the_card_without_reparsing(card_server, cache, clock):
    _publish(card_server, "/a/one", "billing")
    url = _url(card_server, "/a/one")
    first = cache.refresh(url)
    assert first.outcome == Outcome.FETCHED and first.entry.card["skills"][0]["tags"] == ["billing"]
    assert cache.refresh(url).outcome == Outcome.FRESH  # within max-age: no request
    assert card_server.count("/a/one") == 1
    clock.advance(301)
    second = cache.refresh(url)
    assert second.outcome == Outcome.NOT_MODIFIED
    assert card_server.statuses[("/a/one", 304)] == 1
    assert cache.parse_count == 1
    assert second.entry.sha256 == first.entry.sha256
    assert second.entry.changed_at == first.entry.changed_at
    assert second.entry.expires_at == pytest.approx(clock.now + 300)


def test_change_is_the_byte_hash_not_the_etag(card_server, cache, clock):
    _publish(card_server, "/a/v", "x")
    card_server.volatile_etag.add("/a/v")  # a new ETag on every response, same bytes
    url = _url(card_server, "/a/v")
    first = cache.refresh(url)
    clock.advance(400)
    same = cache.refresh(url)
    assert same.outcome == Outcome.UNCHANGED and not same.changed
    assert cache.parse_count == 1
    _publish(card_server, "/a/v", "x", "y")
    clock.advance(400)
    changed = cache.refresh(url)
    assert changed.outcome == Outcome.FETCHED and changed.changed
    assert changed.entry.sha256 != first.entry.sha256 and cache.parse_count == 2
    assert changed.previous.card["skills"][0]["tags"] == ["x"]


def test_cache_control_lifetimes():
    assert cache_lifetime("") == (300.0, False)
    assert cache_lifetime("public, max-age=60") == (60.0, False)
    assert cache_lifetime("no-cache, max-age=60") == (0.0, False)
    assert cache_lifetime("no-store") == (0.0, True)


def test_no_store_and_no_cache_are_honoured(card_server, cache, clock):
    _publish(card_server, "/a/ns", "x")
    _publish(card_server, "/a/nc", "x")
    card_server.cache_control["/a/ns"] = "no-store"
    card_server.cache_control["/a/nc"] = "no-cache"
    ns, nc = _url(card_server, "/a/ns"), _url(card_server, "/a/nc")
    cache.refresh_many([ns, nc])
    row = CardCacheEntry.objects.get(card_url=ns)
    assert row.raw is None and row.card is None and row.etag == ""  # nothing stored
    assert cache.get(ns).has_card  # still served from this process
    results = cache.refresh_many([ns, nc])  # both revalidate at once
    assert results[nc].outcome == Outcome.NOT_MODIFIED  # no-cache: revalidated with the ETag
    assert results[ns].outcome == Outcome.UNCHANGED  # no-store: full GET, nothing kept
    assert card_server.count("/a/ns") == 2 and card_server.count("/a/nc") == 2


def test_expiry_is_jittered(card_server, clock):
    jittered = CardCache(clock=clock, locks=LocalLocks())  # default ±10 %
    prefixes = [f"/a/j{i}" for i in range(30)]
    for p in prefixes:
        _publish(card_server, p, "x")
    results = jittered.refresh_many([_url(card_server, p) for p in prefixes])
    lifetimes = {round(r.entry.expires_at - clock.now, 3) for r in results.values()}
    assert all(270 <= life <= 330 for life in lifetimes)
    assert len(lifetimes) > 20  # spread, not one instant


def test_stale_on_error_with_backoff(card_server, cache, clock):
    _publish(card_server, "/a/flaky", "x")
    url = _url(card_server, "/a/flaky")
    good = cache.refresh(url)
    card_server.down.add("/a/flaky")
    clock.advance(301)
    observed = []
    for failures in range(8):
        before = card_server.count("/a/flaky")
        result = cache.refresh(url)
        assert result.outcome == Outcome.FAILED and "503" in result.error
        assert result.entry.card == good.entry.card  # stale card still served
        assert result.entry.failures == failures + 1
        delay = result.entry.expires_at - clock.now
        observed.append(delay)
        clock.advance(delay - 1)
        assert cache.refresh(url).outcome == Outcome.FRESH  # backing off: no request
        assert card_server.count("/a/flaky") == before + 1
        clock.advance(1)
    assert observed == [5, 10, 20, 40, 80, 160, 300, 300]
    assert [backoff_seconds(n) for n in range(8)] == observed
    card_server.down.clear()
    recovered = cache.refresh(url)
    assert recovered.outcome == Outcome.NOT_MODIFIED and recovered.entry.failures == 0


def test_never_seen_endpoint_surfaces_the_error(card_server, cache):
    url = _url(card_server, "/a/missing")
    result = cache.refresh(url)
    assert result.outcome == Outcome.FAILED and "404" in result.error
    assert result.entry.failures == 1 and not result.entry.has_card
    with pytest.raises(CardFetchFailed, match="404"):
        cache.card(url)


def test_timeout_size_cap_and_invalid_cards(card_server, cache, settings):
    settings.DISCOVERY_FETCH_TIMEOUT_SECONDS = 0.3
    _publish(card_server, "/a/slow", "x")
    card_server.hang["/a/slow"] = 2
    assert "timed out" in cache.refresh(_url(card_server, "/a/slow")).error
    settings.A2A_MAX_CARD_BYTES = 1000
    card_server.set_card("/a/big", make_card("big", "http://127.0.0.1/", [], pad="x" * 2000))
    assert "larger than 1000" in cache.refresh(_url(card_server, "/a/big")).error
    card_server.cards["/a/bad"] = b'{"no": "name"}'
    assert "invalid card" in cache.refresh(_url(card_server, "/a/bad")).error


def test_redirects_followed_only_onto_admitted_hosts(card_server, cache):
    _publish(card_server, "/a/target", "x")
    card_server.redirects["/a/moved"] = _url(card_server, "/a/target")
    card_server.redirects["/a/away"] = "https://elsewhere.example/.well-known/agent-card.json"
    admit = lambda url: url.startswith(card_server.url)  # noqa: E731
    ok = cache.refresh(_url(card_server, "/a/moved"), admit=admit)
    assert ok.outcome == Outcome.FETCHED
    refused = cache.refresh(_url(card_server, "/a/away"), admit=admit)
    assert refused.outcome == Outcome.FAILED and "elsewhere.example" in refused.error


def test_restart_does_not_refetch(card_server, cache, clock):
    for i in range(5):
        _publish(card_server, f"/a/r{i}", "x")
    urls = [_url(card_server, f"/a/r{i}") for i in range(5)]
    cache.refresh_many(urls)
    restarted = CardCache(clock=clock, jitter=0.0, locks=LocalLocks())  # a new process
    results = restarted.refresh_many(urls)
    assert {r.outcome for r in results.values()} == {Outcome.FRESH}
    assert all(r.entry.has_card for r in results.values())
    assert sum(card_server.counts.values()) == 5
    clock.advance(301)
    assert {r.outcome for r in restarted.refresh_many(urls).values()} == {Outcome.NOT_MODIFIED}


def _mass_expiry(card_server, caches, n_urls: int = 40) -> list[str]:
    prefixes = [f"/a/m{i}" for i in range(n_urls)]
    for p in prefixes:
        _publish(card_server, p, "x")
    urls = [_url(card_server, p) for p in prefixes]
    caches[0].refresh_many(urls)
    for c in caches:
        c.expire_all()
    card_server.counts.clear()
    card_server.delay = 0.05  # keep fetches in flight while the other workers arrive
    barrier = threading.Barrier(len(caches))
    errors = []

    def worker(c):
        try:
            barrier.wait()
            results = c.refresh_many(urls)
            assert all(r.entry is not None and r.entry.has_card for r in results.values())
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            from django.db import connection

            connection.close()

    threads = [threading.Thread(target=worker, args=(c,)) for c in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return prefixes


@pytest.mark.django_db(transaction=True)
def test_mass_expiry_four_threads_one_fetch_per_url(card_server, clock):
    shared = CardCache(clock=clock, locks=LocalLocks())
    prefixes = _mass_expiry(card_server, [shared] * 4)
    assert {card_server.count(p) for p in prefixes} == {1}


@pytest.mark.django_db(transaction=True)
def test_mass_expiry_four_workers_redis_lock(card_server, clock, redis_url):
    import redis

    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=RedisLocks.prefix + "*"):  # the locks alone, no flush
        client.delete(key)
    # Four caches with their own in-flight maps stand for four Celery worker processes:
    # only the Redis locks (and the table) keep them single-flight.
    workers = [CardCache(clock=clock, locks=RedisLocks(redis_url)) for _ in range(4)]
    prefixes = _mass_expiry(card_server, workers)
    assert {card_server.count(p) for p in prefixes} == {1}
