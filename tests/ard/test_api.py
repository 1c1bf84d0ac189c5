"""ARD against a running node: the well-known manifest and the registry API, with and without
a token, checked against the specification's JSON Schema and its conformance checks."""

from __future__ import annotations

import time

import httpx
import pytest

from ard import indexer
from ard.documents import A2A_CARD_TYPE, REGISTRY_TYPE
from tests.ard import conformance
from tests.ard.corpus import CARDS
from tests.conftest import make_client

pytestmark = pytest.mark.django_db(transaction=True)


def _register(api: httpx.Client, agent_id: str, *, public: bool, card=None) -> None:
    resp = api.post(
        "/api/v1/agents",
        json={
            "agent_id": agent_id,
            "card": card or CARDS[agent_id],
            "public": public,
            "ttl_seconds": 600,
        },
    )
    assert resp.status_code in (200, 201), resp.text
    assert resp.json()["public"] is public


@pytest.fixture
def node(api):
    """A live node with weather + currency public, flights and hotels not."""
    for agent_id, public in (
        ("weather", True),
        ("currency", True),
        ("flights", False),
        ("hotels", False),
    ):
        _register(api, agent_id, public=public)
    # Searches wait for the documents the node deferred; the manifest answers at once.
    indexer.settle_deferred()
    return api


def _ids(entries) -> list[str]:
    return sorted(e["metadata"]["agentId"] for e in entries if e["type"] == A2A_CARD_TYPE)


def test_manifest_validates_lists_public_agents_and_caches(node, live_server_url):
    with httpx.Client(base_url=live_server_url, timeout=10) as anon:
        resp = anon.get("/.well-known/ai-catalog.json")
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "application/json"
        errors, _warnings = conformance.check_manifest(resp.content)
        assert errors == []
        doc = resp.json()
        assert doc["specVersion"] == "1.0" and doc["host"]["displayName"]
        assert _ids(doc["entries"]) == ["currency", "weather"]
        weather = next(
            e for e in doc["entries"] if e.get("metadata", {}).get("agentId") == "weather"
        )
        assert weather["identifier"] == "urn:air:agent.localhost:a2a:weather"
        assert weather["displayName"] == "Weather Forecaster"
        assert "weather" in weather["tags"] and weather["capabilities"] == ["forecast", "current"]
        assert weather["representativeQueries"][0] == "Will it rain in Seattle tomorrow?"
        assert weather["url"] == f"{live_server_url}/a2a/weather/.well-known/agent-card.json"
        registry = [e for e in doc["entries"] if e["type"] == REGISTRY_TYPE]
        assert len(registry) == 1 and registry[0]["url"] == f"{live_server_url}/ard/v1/"

        # The entry's url is the gateway's rewritten card: a stock client lands on the gateway.
        card = anon.get(weather["url"])
        assert card.status_code == 200
        assert card.json()["name"] == "Weather Forecaster"
        assert card.json()["url"] == f"{live_server_url}/a2a/weather/"

        # ETag and Cache-Control like the gateway's cards.
        etag = resp.headers["etag"]
        assert resp.headers["cache-control"] == "public, max-age=300"
        again = anon.get("/.well-known/ai-catalog.json", headers={"If-None-Match": etag})
        assert again.status_code == 304 and again.content == b""
        head = anon.head("/.well-known/ai-catalog.json")
        assert head.status_code == 200 and head.content == b"" and head.headers["etag"] == etag
        assert head.headers["content-length"] == str(len(resp.content))

    # A change to what is listed changes the bytes and the ETag.
    _register(node, "translator", public=True)
    with httpx.Client(base_url=live_server_url, timeout=10) as anon:
        changed = anon.get("/.well-known/ai-catalog.json", headers={"If-None-Match": etag})
        assert changed.status_code == 200 and changed.headers["etag"] != etag
        assert _ids(changed.json()["entries"]) == ["currency", "translator", "weather"]

    # With a token: what that client may call, privately cacheable.
    full = node.get("/.well-known/ai-catalog.json")
    assert full.headers["cache-control"] == "private, max-age=300"
    assert _ids(full.json()["entries"]) == [
        "currency",
        "flights",
        "hotels",
        "translator",
        "weather",
    ]
    assert conformance.check_manifest(full.content)[0] == []


def test_registry_conformance_with_and_without_token(node, live_server_url):
    base = f"{live_server_url}/ard/v1"
    errors, _ = conformance.check_registry(base)
    assert errors == []
    errors, _ = conformance.check_registry(base, headers=node.headers)
    assert errors == []
    bad = conformance.check_registry(base, headers={"Authorization": "Bearer nope.nope"})[0]
    assert bad  # a wrong token is refused (401), not silently treated as anonymous


def _search(client: httpx.Client, body: dict) -> httpx.Response:
    return client.post("/ard/v1/search", json=body)


def test_search_ranks_scores_and_follows_entitlement(node, live_server_url):
    with httpx.Client(base_url=live_server_url, timeout=10) as anon:
        resp = _search(anon, {"query": {"text": "book a flight to Tokyo"}})
        assert resp.status_code == 200
        found = [r["metadata"]["agentId"] for r in resp.json()["results"]]
        assert "flights" not in found  # not public
        resp = _search(anon, {"query": {"text": "will it rain in Oslo tomorrow"}})
        assert conformance.openapi_errors("SearchResponse", resp.json()) == []
        assert conformance.openapi_errors("SearchResponse", {"results": [{"score": 7}]})
        results = resp.json()["results"]
        assert results[0]["metadata"]["agentId"] == "weather" and results[0]["score"] == 100
        assert results[0]["source"] == f"{live_server_url}/ard/v1/"
        for item in results:
            assert (
                conformance.entry_schema_errors(
                    {k: v for k, v in item.items() if k not in ("score", "source")}
                )
                == []
            )
            assert 0 <= item["score"] <= 100

    resp = _search(node, {"query": {"text": "book a flight to Tokyo"}})
    assert resp.json()["results"][0]["metadata"]["agentId"] == "flights"
    assert conformance.openapi_errors("SearchResponse", resp.json()) == []

    # A call client limited to one agent sees the public ones plus that one.
    _, token = make_client(["call"], agents=["hotels"])
    with httpx.Client(
        base_url=live_server_url, timeout=10, headers={"Authorization": f"Bearer {token}"}
    ) as limited:
        text = {"query": {"text": "hotel room flight forecast currency exchange"}, "pageSize": 100}
        got = sorted(r["metadata"]["agentId"] for r in _search(limited, text).json()["results"])
        assert got == ["currency", "hotels", "weather"]
    # A register-only client calls nothing: the public tier.
    _, token = make_client(["register"])
    with httpx.Client(
        base_url=live_server_url, timeout=10, headers={"Authorization": f"Bearer {token}"}
    ) as registrar:
        got = sorted(r["metadata"]["agentId"] for r in _search(registrar, text).json()["results"])
        assert got == ["currency", "weather"]


def test_filters_or_within_and_across_keys(node):
    text = "hotel room flight forecast currency exchange"

    def ids(filter_: dict) -> list[str]:
        resp = _search(node, {"query": {"text": text, "filter": filter_}, "pageSize": 100})
        assert resp.status_code == 200, resp.text
        return sorted(r["metadata"]["agentId"] for r in resp.json()["results"])

    assert ids({}) == ["currency", "flights", "hotels", "weather"]
    assert ids({"tags": ["forex", "hotel"]}) == ["currency", "hotels"]  # OR within a key
    assert ids({"tags": ["travel"], "capabilities": "book-flight"}) == ["flights"]  # AND
    assert ids({"type": [A2A_CARD_TYPE]}) == ["currency", "flights", "hotels", "weather"]
    assert ids({"type": "application/mcp-server-card+json"}) == []
    assert ids({"publisher": ["agent.localhost"]}) == ["currency", "flights", "hotels", "weather"]
    assert ids({"publisher": ["example.com"]}) == []
    assert ids({"metadata.agentId": ["hotels", "weather"]}) == ["hotels", "weather"]
    assert ids({"representativeQueries": ["7-day forecast for Berlin"]}) == ["weather"]
    assert ids({"trustManifest.attestations.type": ["SOC2-Type2"]}) == []
    assert ids({"host.displayName": ["A2A Agent Registry"], "tags": "booking"}) == [
        "flights",
        "hotels",
    ]


def test_pagination_walks_every_match_once(node):
    body = {"query": {"text": "hotel room flight forecast currency exchange"}, "pageSize": 1}
    seen, pages = [], 0
    while True:
        page = _search(node, body).json()
        seen += [r["metadata"]["agentId"] for r in page["results"]]
        pages += 1
        if "pageToken" not in page:
            break
        body = {**body, "pageToken": page["pageToken"]}
        assert pages < 10
    assert sorted(seen) == ["currency", "flights", "hotels", "weather"] and pages == 4
    other = _search(node, {"query": {"text": "something else"}, "pageToken": body["pageToken"]})
    assert other.status_code == 400 and other.json()["errorCode"] == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"query": {}}, "query.text is required"),
        ({"query": {"text": "  "}}, "non-empty"),
        ({"query": {"text": "x"}, "pageSize": 101}, "pageSize"),
        ({"query": {"text": "x"}, "pageSize": 0}, "pageSize"),
        ({"query": {"text": "x"}, "limit": 3}, "unknown field"),
        ({"query": {"text": "x", "filter": {"nosuch": ["a"]}}}, "unsupported field"),
        ({"query": {"text": "x", "filter": {"tags": [1]}}}, "strings"),
        ({"query": {"text": "x", "filter": {"tags": ["a"] * 101}}}, "more than 100"),
        ({"query": {"text": "x" * 2001}}, "longer than"),
        ({"query": {"text": "x"}, "federation": "everywhere"}, "federation"),
        ({"query": {"text": "x"}, "pageToken": "garbage!"}, "pageToken"),
    ],
)
def test_search_bad_input_is_a_clear_400(node, body, needle):
    resp = _search(node, body)
    assert resp.status_code == 400
    assert resp.json()["errorCode"] == "INVALID_ARGUMENT" and needle in resp.json()["message"]
    assert conformance.openapi_errors("Error", resp.json()) == []


def test_errors_of_appendix_b(node, live_server_url):
    with httpx.Client(base_url=live_server_url, timeout=10) as anon:
        resp = anon.post(
            "/ard/v1/search", content=b"{not json", headers={"Content-Type": "application/json"}
        )
        assert resp.status_code == 400 and resp.json()["errorCode"] == "INVALID_ARGUMENT"
        resp = anon.post("/ard/v1/search", content=b"[" + b"1," * 40000 + b"1]")
        assert resp.status_code == 400 and "larger than" in resp.json()["message"]
        resp = anon.post(
            "/ard/v1/search",
            json={"query": {"text": "x"}},
            headers={"Authorization": "Bearer abc.def"},
        )
        assert resp.status_code == 401 and resp.json()["errorCode"] == "UNAUTHENTICATED"
        resp = anon.get("/ard/v1/nothing-here")
        assert resp.status_code == 404 and resp.json()["errorCode"] == "NOT_FOUND"
        resp = anon.get("/ard/v1/search")
        assert resp.status_code == 405 and resp.headers["allow"] == "POST"
        assert anon.get("/ard/v1/").json()["operations"]["search"].endswith("/ard/v1/search")


def test_explore_counts_facets_over_the_matched_set(node):
    def explore(body: dict) -> dict:
        resp = node.post("/ard/v1/explore", json=body)
        assert resp.status_code == 200, resp.text
        return resp.json()

    everything = explore(
        {
            "resultType": {
                "facets": [{"field": "type"}, {"field": "publisher"}, {"field": "tags", "limit": 2}]
            }
        }
    )
    assert everything["resultType"] == "facets"
    assert conformance.openapi_errors("ExploreResponse", everything) == []
    assert everything["facets"]["type"]["buckets"] == [{"value": A2A_CARD_TYPE, "count": 4}]
    assert everything["facets"]["publisher"]["buckets"] == [
        {"value": "agent.localhost", "count": 4}
    ]
    tags = everything["facets"]["tags"]
    assert tags["buckets"][0] == {"value": "booking", "count": 2} and len(tags["buckets"]) == 2
    assert tags["otherCount"] > 0
    narrowed = explore(
        {
            "query": {"text": "rent a hotel room", "filter": {"tags": "travel"}},
            "resultType": {"facets": [{"field": "metadata.agentId"}]},
        }
    )
    assert narrowed["facets"]["metadata.agentId"]["buckets"] == [{"value": "hotels", "count": 1}]
    bad = node.post("/ard/v1/explore", json={"query": {"text": "x"}})
    assert bad.status_code == 400 and "resultType" in bad.json()["message"]
    for facets, needle in (
        ([{"field": "tags"}] * 17, "1 to 16 facets"),
        ([{"field": "tags", "limit": 1001}], "limit"),
        ([{"field": "nosuch"}], "unsupported field"),
    ):
        bad = node.post("/ard/v1/explore", json={"resultType": {"facets": facets}})
        assert bad.status_code == 400 and needle in bad.json()["message"]


def test_list_agents_filter_expression_order_and_pages(node, live_server_url):
    resp = node.get("/ard/v1/agents", params={"pageSize": 3, "orderBy": "displayName DESC"})
    body = resp.json()
    assert resp.status_code == 200 and body["total"] == 4
    assert conformance.openapi_errors("ListResponse", body) == []
    assert [i["displayName"] for i in body["items"]] == [
        "Weather Forecaster",
        "Hotel Booker",
        "Flight Finder",
    ]
    for item in body["items"]:
        assert conformance.entry_schema_errors(item) == []
    rest = node.get(
        "/ard/v1/agents",
        params={"pageSize": 3, "orderBy": "displayName DESC", "pageToken": body["pageToken"]},
    ).json()
    assert [i["displayName"] for i in rest["items"]] == ["Currency Exchange"]
    assert "pageToken" not in rest
    expr = f"type = '{A2A_CARD_TYPE}' AND tags = 'travel,forex' AND createdAfter > '2020-01-01'"
    got = node.get("/ard/v1/agents", params={"filter": expr}).json()
    assert sorted(i["metadata"]["agentId"] for i in got["items"]) == [
        "currency",
        "flights",
        "hotels",
    ]
    got = node.get("/ard/v1/agents", params={"filter": "displayName = 'hotel'"}).json()
    assert [i["metadata"]["agentId"] for i in got["items"]] == ["hotels"]
    with httpx.Client(base_url=live_server_url, timeout=10) as anon:
        assert anon.get("/ard/v1/agents").json()["total"] == 2
    for params in (
        {"filter": "colour = 'red'"},
        {"filter": "tags = 'a' OR tags = 'b'"},
        {"filter": "createdAfter > 'yesterday'"},
        {"orderBy": "price"},
        {"pageSize": "1000"},
        {"limit": "5"},
    ):
        resp = node.get("/ard/v1/agents", params=params)
        assert resp.status_code == 400 and resp.json()["errorCode"] == "INVALID_ARGUMENT"


def test_index_follows_registry_events(node):
    def top(text: str) -> list[str]:
        return [
            r["metadata"]["agentId"]
            for r in _search(node, {"query": {"text": text}}).json()["results"]
        ]

    assert top("convert dollars to euros")[0] == "currency"
    assert node.delete("/api/v1/agents/currency").status_code == 204
    assert "currency" not in top("convert dollars to euros")
    card = {
        **CARDS["weather"],
        "name": "Volcano Watch",
        "description": "Volcanic ash and eruption alerts.",
        "skills": [],
    }
    _register(node, "weather", public=True, card=card)
    assert top("volcanic eruption alerts") == ["weather"]
    assert top("will it rain tomorrow") == []


def test_public_flag_and_expiry_follow_events(node, live_server_url):
    from datetime import timedelta

    from django.utils import timezone

    from registry import services

    def anonymous_ids(expected: list[str]) -> list[str]:
        """The catalog's public ids once they are ``expected`` (or what it lists after 10 s):
        the manifest answers at once, without waiting for the search documents the node
        deferred, so a change shows in it a moment later (docs/ard.md)."""
        deadline = time.monotonic() + 10
        with httpx.Client(base_url=live_server_url, timeout=10) as anon:
            while True:
                ids = _ids(anon.get("/.well-known/ai-catalog.json").json()["entries"])
                if ids == expected or time.monotonic() > deadline:
                    return ids
                time.sleep(0.05)

    assert anonymous_ids(["currency", "weather"]) == ["currency", "weather"]
    resp = node.patch("/api/v1/agents/currency", json={"public": False})
    assert resp.status_code == 200 and resp.json()["public"] is False
    resp = node.patch("/api/v1/agents/flights", json={"public": True})
    assert resp.status_code == 200
    assert anonymous_ids(["flights", "weather"]) == ["flights", "weather"]
    # Expiry (the registry's expiry job) hides an agent at once; registering brings it back.
    services.agents_expire(now=timezone.now() + timedelta(seconds=601))
    assert anonymous_ids([]) == []
    _register(node, "weather", public=True)
    assert anonymous_ids(["weather"]) == ["weather"]


def test_searches_run_on_their_own_pool_and_never_hold_the_node(node, live_server_url,
                                                                 monkeypatch):
    """With every search thread busy, a search waits while the node's other requests (another
    ARD operation -- the manifest --, the health check) answer at once; past MAX_PENDING
    admitted searches the next one (a list too) is refused with a 503 and Retry-After; once a
    thread frees up, the queued search answers normally."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from ard import views

    release = threading.Event()
    monkeypatch.setattr(views, "MAX_PENDING", 1)
    pool = views._pool_executor()
    blockers = [pool.submit(release.wait, 30) for _ in range(views.WORKERS)]
    body = {"query": {"text": "weather forecast"}}
    try:
        with httpx.Client(base_url=live_server_url, timeout=30) as http, \
                ThreadPoolExecutor(1) as waiting:
            queued = waiting.submit(http.post, "/ard/v1/search", json=body)
            deadline = time.monotonic() + 10
            while views._pending[0] < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert views._pending[0] == 1 and not queued.done()
            assert http.get("/healthz").status_code == 200
            assert http.get("/.well-known/ai-catalog.json").status_code == 200
            refused = http.get("/ard/v1/agents")  # the list runs on the search pool too
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            refused = http.post("/ard/v1/search", json=body)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert refused.json()["errorCode"] == "UNAVAILABLE"
            assert not queued.done()
            release.set()
            answered = queued.result(timeout=30)
        assert answered.status_code == 200
        assert answered.json()["results"][0]["metadata"]["agentId"] == "weather"
    finally:
        release.set()
        for blocker in blockers:
            blocker.result(timeout=30)
