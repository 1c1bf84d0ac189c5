"""ARD catalogs as a discovery source, against real HTTP servers on loopback: a counting card
server that speaks HTTP caching (tests/discovery/servers.py) and the platform itself."""

from __future__ import annotations

import threading

import httpx
import pytest

from core.locks import LocalLocks
from discovery.catalogs import CatalogCache, catalog_records, catalog_url_for
from discovery.config_file import ConfigFileError
from discovery.loop import run_cycle
from discovery.models import Alert, CatalogListing, Snapshot, SourceFeed
from discovery.resolver import Admission, AllowEntry
from discovery.sources import SourceError
from registry.models import Agent
from tests.discovery.servers import make_card, skill

pytestmark = pytest.mark.django_db

TEXT = {"input_modes": ["text/plain"], "output_modes": ["text/plain"]}
CAT = "/pub/.well-known/ai-catalog.json"
A2A = "application/a2a-agent-card+json"
TRUST = {
    "identity": "spiffe://example.test/hotels",
    "identityType": "spiffe",
    "attestations": [
        {
            "type": "SOC2-Type2",
            "uri": "https://example.test/soc2.pdf",
            "mediaType": "application/pdf",
        }
    ],
}


def _card_entry(server, name: str, *, trust=None) -> dict:
    entry = {
        "identifier": f"urn:air:example.test:travel:{name}",
        "displayName": name,
        "type": A2A,
        "url": f"{server.base('/a/' + name)}.well-known/agent-card.json",
    }
    if trust:
        entry["trustManifest"] = trust
    return entry


def _publish(server) -> None:
    """A publisher's catalog: cards by URL and inline, a nested catalog inline and one by URL
    (which nests one level too deep), and entries of other media types."""
    for name, tag in (
        ("weather", "weather"),
        ("flights", "travel"),
        ("hotels", "travel"),
        ("deep", "travel"),
    ):
        server.set_card(
            f"/a/{name}", make_card(f"{name} card", server.base(f"/a/{name}"), [skill(name, tag)])
        )
    inline = make_card("ferries card", server.base("/a/ferries"), [skill("ferries", "travel")])
    server.set_card(
        "/nested/catalog.json",
        {
            "specVersion": "1.0",
            "entries": [
                _card_entry(server, "hotels", trust=TRUST),
                {
                    "identifier": "urn:air:example.test:more",
                    "displayName": "more",
                    "type": "application/ai-catalog+json",
                    "url": "/deeper/catalog.json",
                },
            ],
        },
    )
    server.set_card(
        "/deeper/catalog.json", {"specVersion": "1.0", "entries": [_card_entry(server, "deep")]}
    )
    server.set_card(
        CAT,
        {
            "specVersion": "1.0",
            "host": {"displayName": "Example"},
            "entries": [
                _card_entry(server, "weather"),
                {
                    "identifier": "urn:air:example.test:travel:ferries",
                    "displayName": "Ferries",
                    "type": A2A,
                    "data": inline,
                },
                {
                    "identifier": "urn:air:example.test:mcp:maps",
                    "displayName": "Maps",
                    "type": "application/mcp-server-card+json",
                    "url": "https://example.test/mcp",
                },
                {
                    "identifier": "urn:air:example.test:registry:main",
                    "displayName": "Registry",
                    "type": "application/ai-registry+json",
                    "url": "https://example.test/ard/",
                },
                {
                    "identifier": "urn:air:example.test:bundle",
                    "displayName": "Bundle",
                    "type": "application/ai-catalog+json",
                    "data": {"specVersion": "1.0", "entries": [_card_entry(server, "flights")]},
                },
                {
                    "identifier": "urn:air:example.test:sub",
                    "displayName": "Sub",
                    "type": "application/ai-catalog+json",
                    "url": "/nested/catalog.json",
                },
                {"identifier": "urn:air:example.test:broken", "displayName": "Broken", "type": A2A},
            ],
        },
    )


def _admission() -> Admission:
    return Admission([AllowEntry("127.0.0.1", True)])


def test_catalog_entries_become_records_with_nesting_bounds_and_counted_ignores(card_server, clock):
    _publish(card_server)
    cat_cache = CatalogCache(clock=clock, jitter=0.0, locks=LocalLocks())
    report = catalog_records(
        url=card_server.url + CAT, options={"max_depth": 1}, cache=cat_cache, admission=_admission()
    )
    names = sorted(r.local_name for r in report.records)
    assert names == ["ferries", "flights", "hotels", "weather"]  # "deep" is 2 levels down
    by_name = {r.local_name: r for r in report.records}
    assert (
        by_name["weather"].card_url
        == card_server.base("/a/weather") + ".well-known/agent-card.json"
    )
    assert by_name["ferries"].inline_card is not None
    assert report.ignored == {
        "media type application/mcp-server-card+json": 1,
        "media type application/ai-registry+json": 1,
        "nested catalog beyond max_depth": 1,
        "entry without exactly one of url and data": 1,
    }
    listing = CatalogListing.objects.get(identifier="urn:air:example.test:travel:hotels")
    assert listing.trust_manifest == TRUST
    assert listing.catalog_url == card_server.url + "/nested/catalog.json"
    assert (
        CatalogListing.objects.get(identifier="urn:air:example.test:travel:weather").trust_manifest
        is None
    )

    deeper = catalog_records(
        url=card_server.url + CAT, options={"max_depth": 2}, cache=cat_cache, admission=_admission()
    )
    assert "deep" in [r.local_name for r in deeper.records]


def test_catalog_fetch_is_conditional_and_stale_on_error(card_server, clock):
    _publish(card_server)
    cat_cache = CatalogCache(clock=clock, jitter=0.0, locks=LocalLocks())
    url = card_server.url + CAT

    def read():
        return catalog_records(
            url=url, options={"max_depth": 0}, cache=cat_cache, admission=_admission()
        )

    assert len(read().records) == 2  # weather and inline ferries at depth 0
    assert len(read().records) == 2
    assert card_server.statuses[(CAT, 200)] == 1  # fresh for max-age: no second request
    clock.advance(301)
    read()
    assert card_server.statuses[(CAT, 304)] == 1  # revalidated with If-None-Match
    clock.advance(301)
    card_server.down.add(CAT)
    stale = read()
    assert sorted(r.local_name for r in stale.records) == ["ferries", "weather"]
    assert card_server.statuses[(CAT, 503)] == 1
    assert cat_cache.get(url).failures == 1
    with pytest.raises(SourceError, match="HTTP 404"):
        catalog_records(
            url=card_server.url + "/nobody/.well-known/ai-catalog.json",
            cache=cat_cache,
            admission=_admission(),
        )


@pytest.mark.django_db(transaction=True)
def test_concurrent_reads_share_one_fetch(card_server, clock):
    _publish(card_server)
    card_server.delay = 0.3
    cat_cache = CatalogCache(clock=clock, jitter=0.0, locks=LocalLocks())
    results: list[int] = []
    barrier = threading.Barrier(4)

    def read():
        from django.db import connection

        try:
            barrier.wait()
            report = catalog_records(
                url=card_server.url + CAT,
                options={"max_depth": 0},
                cache=cat_cache,
                admission=_admission(),
            )
            results.append(len(report.records))
        finally:
            connection.close()

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [2, 2, 2, 2]
    assert card_server.count(CAT) == 1


def test_allowlist_bounds_catalogs_and_cards(card_server, clock):
    _publish(card_server)
    cat_cache = CatalogCache(clock=clock, jitter=0.0, locks=LocalLocks())
    with pytest.raises(SourceError, match="not on the discovery allowlist"):
        catalog_records(
            url=card_server.url + CAT,
            cache=cat_cache,
            admission=Admission([AllowEntry("example.test", True)]),
        )
    card_server.set_card(
        CAT,
        {
            "specVersion": "1.0",
            "entries": [
                {
                    "identifier": "urn:air:x.test:sub",
                    "displayName": "sub",
                    "type": "application/ai-catalog+json",
                    "url": "http://10.1.2.3/catalog.json",
                }
            ],
        },
    )
    report = catalog_records(url=card_server.url + CAT, cache=cat_cache, admission=_admission())
    assert report.ignored == {"nested catalog not admitted": 1}


def test_cycle_through_a_catalog_source(card_server, configure, cache, clock):
    """The loop: records from a catalog go through resolver, cache, matcher, registry upsert and
    snapshot like any other source's."""
    _publish(card_server)
    configure(
        catalogs=[{"url": card_server.url + "/pub/", "max_depth": 1}],
        needs=[{"tag": "travel", **TEXT, "description": "Travel bookings."}],
    )
    feed = SourceFeed.objects.get(kind=SourceFeed.Kind.CATALOG)
    assert feed.url == card_server.url + CAT and feed.options == {"max_depth": 1}
    report = run_cycle(cache=cache)
    assert report.source_errors == [] and report.published
    snapshot = Snapshot.objects.current()
    assert [a["local_name"] for a in snapshot.agents] == ["ferries", "flights", "hotels"]
    assert {a["description"] for a in snapshot.agents} == {"Travel bookings."}
    routable = set(
        Agent.objects.routable()
        .filter(source=Agent.Source.DISCOVERY)
        .values_list("agent_id", flat=True)
    )
    assert routable == {"ferries", "flights", "hotels"}

    # The morning-of-changes behaviours apply unchanged: a card's skills change -> alert.
    card_server.set_card(
        "/a/hotels",
        make_card(
            "hotels card",
            card_server.base("/a/hotels"),
            [skill("hotels", "travel"), skill("spa", "travel")],
        ),
    )
    cache.expire_all()
    run_cycle(cache=cache)
    assert Alert.objects.filter(kind=Alert.Kind.SKILLS_CHANGED).exists()


def test_a_catalog_published_by_this_platform_is_discoverable(
    live_server_url, admin_token, configure, cache, settings
):
    """One node publishes its ai-catalog.json; discovery reads it and follows each entry to
    the gateway's rewritten card."""
    from tests.ard.corpus import CARDS

    with httpx.Client(
        base_url=live_server_url, timeout=10, headers={"Authorization": f"Bearer {admin_token}"}
    ) as api:
        for agent_id in ("weather", "translator"):
            api.post(
                "/api/v1/agents",
                json={"agent_id": agent_id, "card": CARDS[agent_id], "public": True},
            ).raise_for_status()
    # A prefix keeps the peer's names apart from this registry's own agents (same database).
    configure(
        catalogs=[{"url": live_server_url, "prefix": "peer"}],
        needs=[{"tag": "language", **TEXT, "description": "Translation."}],
    )
    report = run_cycle(cache=cache)
    assert report.source_errors == [] and report.errors == []
    assert [a["local_name"] for a in Snapshot.objects.current().agents] == ["peer_translator"]
    assert Agent.objects.get(agent_id="peer-translator").url == f"{live_server_url}/a2a/translator/"
    entry = cache.get(f"{live_server_url}/a2a/translator/.well-known/agent-card.json")
    assert entry is not None and entry.card["url"] == f"{live_server_url}/a2a/translator/"


@pytest.mark.parametrize(
    ("catalogs", "needle"),
    [
        ({"catalogs": "example.com"}, "must be a list"),
        ({"catalogs": [{"domain": "https://x.test"}]}, "a host name"),
        ({"catalogs": [{"url": "https://x.test", "max_depth": 99}]}, "max_depth"),
        ({"catalogs": [{"url": "https://x.test", "colour": 1}]}, "unknown keys"),
        ({"catalogs": [{}]}, "a domain or a url"),
    ],
)
def test_bad_catalog_configuration_is_a_clear_error(configure, catalogs, needle):
    with pytest.raises(ConfigFileError, match=needle):
        configure(**catalogs)


def test_catalog_locations():
    assert (
        catalog_url_for("partner.example.com")
        == "https://partner.example.com/.well-known/ai-catalog.json"
    )
    assert (
        catalog_url_for("http://127.0.0.1:9000/")
        == "http://127.0.0.1:9000/.well-known/ai-catalog.json"
    )
    assert catalog_url_for("https://x.test/catalogs/eng.json") == "https://x.test/catalogs/eng.json"


def test_catalog_size_and_entry_bounds(card_server, clock, settings, monkeypatch):
    _publish(card_server)
    settings.DISCOVERY_CATALOG_MAX_BYTES = 1024
    big = {
        "specVersion": "1.0",
        "entries": [_card_entry(card_server, f"agent{i}") for i in range(40)],
    }
    card_server.set_card(CAT, big)
    cat_cache = CatalogCache(clock=clock, jitter=0.0, locks=LocalLocks())
    with pytest.raises(SourceError, match="catalog is larger than 1024 bytes"):
        catalog_records(url=card_server.url + CAT, cache=cat_cache, admission=_admission())
    settings.DISCOVERY_CATALOG_MAX_BYTES = 1024 * 1024
    monkeypatch.setattr("discovery.catalogs.MAX_ENTRIES_PER_CATALOG", 25)
    clock.advance(3600)
    report = catalog_records(url=card_server.url + CAT, cache=cat_cache, admission=_admission())
    assert len(report.records) == 25
    assert report.ignored == {"over the entries-per-catalog limit": 15}
