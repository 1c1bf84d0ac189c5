"""The /api/v1 registry API over a real ASGI server: happy paths, auth, bad input, races."""

from __future__ import annotations

import hashlib
import threading

import httpx
import pytest
from django.test import Client as DjangoClient
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from registry import services
from registry.models import Agent, CardVersion
from registry.permissions import SYSTEM
from tests.conftest import make_client
from tests.registry.cards import card_03, card_10
from tests.servers import serve_app


def test_register_read_update_delete(api: httpx.Client):
    r = api.post(
        "/api/v1/agents",
        json={"agent_id": "echo-1", "card": card_03(), "ttl_seconds": 60, "max_concurrency": 5},
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["agent_id"] == "echo-1" and body["status"] == "active" and body["routable"]
    assert body["ttl_seconds"] == 60 and body["max_concurrency"] == 5
    assert body["tags"] == ["echo", "test"] and body["url"] == "http://127.0.0.1:9/"
    r = api.get("/api/v1/agents/echo-1")
    assert r.status_code == 200 and r.json()["name"] == "Echo Agent"
    r = api.patch("/api/v1/agents/echo-1", json={"max_concurrency": 9})
    assert r.status_code == 200 and r.json()["max_concurrency"] == 9
    r = api.post("/api/v1/agents/echo-1/heartbeat")
    assert r.status_code == 200 and r.json()["expires_at"] >= body["expires_at"]
    assert api.delete("/api/v1/agents/echo-1").status_code == 204
    assert api.get("/api/v1/agents/echo-1").status_code == 404
    r = api.delete("/api/v1/agents/echo-1")
    assert r.status_code == 404 and r.json()["error"] == "agent not found"


def test_card_is_served_byte_exact(api: httpx.Client):
    raw = (
        b'{"name": "Signed",  "url": "http://127.0.0.1:9/",\n "signatures": '
        b'[{"protected": "eyJhbGciOiJFUzI1NiJ9", "signature": "c2ln"}]}'
    )
    services.agent_register(actor=SYSTEM, agent_id="signed", card=raw)
    r = api.get("/api/v1/agents/signed/card")
    assert r.status_code == 200 and r.content == raw
    assert r.headers["content-type"].startswith("application/json")


def test_filters_and_pagination(api: httpx.Client):
    api.post("/api/v1/agents", json={"agent_id": "echo-1", "card": card_03()})
    api.post("/api/v1/agents", json={"agent_id": "warranty-1", "card": card_10()})
    api.post("/api/v1/agents", json={"agent_id": "echo-2", "card": card_03(tags=("other",))})

    def ids(**params):
        r = api.get("/api/v1/agents", params=params)
        assert r.status_code == 200, r.text
        return [a["agent_id"] for a in r.json()["results"]]

    assert ids(tag="echo") == ["echo-1"]
    assert ids(skill="claims") == ["warranty-1"]
    assert ids(input_mode="image/png") == ["warranty-1"]
    assert ids(output_mode="text/plain") == ["echo-1", "echo-2"]
    assert ids(q="warranty") == ["warranty-1"]
    assert ids(status="active") == ["echo-1", "echo-2", "warranty-1"]
    assert ids(status="expired") == []
    page = api.get("/api/v1/agents", params={"limit": 2}).json()
    assert page["count"] == 3 and len(page["results"]) == 2 and page["next"]
    assert api.get("/api/v1/agents", params={"status": "bogus"}).status_code == 400


def test_authentication_and_authorization(live_server_url):
    _, registrar = make_client(["register"], name="reg-a")
    _, other = make_client(["register"], name="reg-b")
    _, caller = make_client(["call"], name="caller-only")
    with httpx.Client(base_url=live_server_url) as http:
        r = http.get("/api/v1/agents")
        assert r.status_code == 401 and "authentication" in r.json()["error"]
        r = http.get("/api/v1/agents", headers={"Authorization": "Bearer nope.nope"})
        assert r.status_code == 401 and r.json()["error"] == "invalid or revoked token"
        r = http.get("/api/v1/agents", headers={"Authorization": "Basic dXNlcjpwdw=="})
        assert r.status_code == 401

        def as_(token):
            return {"Authorization": f"Bearer {token}"}

        r = http.post(
            "/api/v1/agents", headers=as_(registrar), json={"agent_id": "owned", "card": card_03()}
        )
        assert r.status_code == 201
        r = http.post(
            "/api/v1/agents", headers=as_(other), json={"agent_id": "owned", "card": card_03()}
        )
        assert r.status_code == 403 and "another client" in r.json()["error"]
        assert http.delete("/api/v1/agents/owned", headers=as_(other)).status_code == 403
        r = http.post(
            "/api/v1/agents", headers=as_(caller), json={"agent_id": "x-1", "card": card_03()}
        )
        assert r.status_code == 403
        assert (
            http.post("/api/v1/agents/owned/heartbeat", headers=as_(registrar)).status_code == 200
        )
    assert Agent.objects.get(agent_id="owned").owner.client_id == "reg-a"


def test_anonymous_access_when_enabled(live_server_url, settings):
    settings.A2A_ALLOW_ANONYMOUS = True
    with httpx.Client(base_url=live_server_url) as http:
        r = http.post("/api/v1/agents", json={"agent_id": "anon-1", "card": card_03()})
        assert r.status_code == 201
        assert http.get("/api/v1/agents").status_code == 200


BAD_BODIES = [
    (b"{not json", "JSON parse error"),
    (b"[1, 2]", "expected a JSON object"),
    (b'"just a string"', "expected a JSON object"),
    (b'{"agent_id": 5, "card": {}}', "agent_id"),
    (b'{"agent_id": "ok-1", "card": "not an object"}', "card must be a JSON object"),
    (b'{"agent_id": "ok-1", "card": {"name": "x"}, "ttl_seconds": "90"}', "ttl_seconds"),
    (b'{"agent_id": "ok-1", "card": {"name": "x"}, "ttl_seconds": 1.5}', "ttl_seconds"),
    (b'{"agent_id": "ok-1", "card": {"name": "x"}, "max_concurrency": true}', "max_concurrency"),
    (
        b'{"agent_id": "ok-1", "card": {"name": "x", "url": "http://127.0.0.1:9/"}, "evil": 1}',
        "evil: unknown field",
    ),
    (
        b'{"agent_id": "Bad_Id", "card": {"name": "x", "url": "http://127.0.0.1:9/"}}',
        "invalid agent_id",
    ),
    (
        b'{"agent_id": "_AGENTS_.x", "card": {"name": "x", "url": "http://127.0.0.1:9/"}}',
        "reserved prefix",
    ),
    (b'{"agent_id": "ok-1", "card": {"name": "x", "url": "/relative"}}', "http or https"),
    (b'{"agent_id": "ok-1", "card": {"name": "x", "url": "file:///etc/passwd"}}', "http or https"),
    (b'{"agent_id": "ok-1", "card": {"name": "x", "url": "http://169.254.169.254/"}}', "metadata"),
    (b'{"agent_id": "ok-1", "card": {"name": "x"}}', "an endpoint is required"),
    (b'{"agent_id": "ok-1"}', "either a url or a card is required"),
]


@pytest.mark.parametrize("body, message", BAD_BODIES)
def test_bad_input_is_a_clear_400_and_writes_nothing(api: httpx.Client, body, message):
    r = api.post("/api/v1/agents", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]
    assert Agent.objects.count() == 0


def test_oversized_card_and_body(api: httpx.Client):
    card = card_03()
    card["description"] = "x" * (70 * 1024)
    r = api.post("/api/v1/agents", json={"agent_id": "big-1", "card": card})
    assert r.status_code == 400 and "larger than 65536 bytes" in r.json()["error"]
    r = api.post(
        "/api/v1/agents",
        content=b'{"agent_id": "' + b"a" * (2 * 1024 * 1024) + b'"}',
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 413 and r.json()["error"].startswith("request body too large")
    assert Agent.objects.count() == 0


def test_unknown_agent_heartbeat_and_card(api: httpx.Client):
    assert api.post("/api/v1/agents/ghost/heartbeat").status_code == 404
    assert api.get("/api/v1/agents/ghost/card").status_code == 404
    assert api.patch("/api/v1/agents/ghost", json={"ttl_seconds": 5}).status_code == 404


def _card_server(served: dict, status: int = 200):
    """A card server answering ``served["body"]`` (or ``status`` with an error when None)."""

    async def card(request):
        if served.get("body") is None:
            return JSONResponse({"error": "nope"}, status_code=status)
        return Response(served["body"], media_type="application/json")

    return Starlette(routes=[Route("/.well-known/agent-card.json", card)])


def test_register_without_card_fetches_it(api: httpx.Client):
    import orjson

    served: dict = {}
    with serve_app(_card_server(served), lifespan="off") as agent:
        raw = served["body"] = orjson.dumps(card_03(agent.url + "/"))
        r = api.post("/api/v1/agents", json={"agent_id": "fetched", "url": agent.url + "/"})
        assert r.status_code == 201, r.text
        assert r.json()["name"] == "Echo Agent" and r.json()["url"] == agent.url + "/"
    assert api.get("/api/v1/agents/fetched/card").content == raw


def test_register_without_card_fails_clearly(api: httpx.Client):
    with serve_app(_card_server({}, status=404), lifespan="off") as agent:
        r = api.post("/api/v1/agents", json={"agent_id": "nocard", "url": agent.url + "/"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert "could not fetch an A2A agent card" in error and "HTTP 404" in error
    from tests.servers import free_port

    r = api.post(
        "/api/v1/agents", json={"agent_id": "nocard", "url": f"http://127.0.0.1:{free_port()}/"}
    )
    assert r.status_code == 400 and "could not fetch" in r.json()["error"]
    assert Agent.objects.count() == 0


def test_concurrent_registrations_of_one_id(live_server_url, admin_token):
    """Eight simultaneous registrations of one id: one row, every request answered."""
    results: list[int] = []
    barrier = threading.Barrier(8)

    def register(i: int) -> None:
        with httpx.Client(
            base_url=live_server_url, timeout=30, headers={"Authorization": f"Bearer {admin_token}"}
        ) as http:
            barrier.wait()
            r = http.post(
                "/api/v1/agents", json={"agent_id": "racer", "card": card_03(name=f"Racer {i}")}
            )
            results.append(r.status_code)

    threads = [threading.Thread(target=register, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results).count(201) == 1 and sorted(results).count(200) == 7, results
    assert Agent.objects.filter(agent_id="racer").count() == 1
    assert CardVersion.objects.filter(agent__agent_id="racer").count() == 8


def test_ttl_expiry_removes_agent_from_listing(api: httpx.Client):
    from registry.tasks import agents_expire_task

    api.post("/api/v1/agents", json={"agent_id": "brief", "card": card_03(), "ttl_seconds": 1})
    api.post("/api/v1/agents", json={"agent_id": "stays", "card": card_03(), "ttl_seconds": 300})
    import time

    time.sleep(1.2)
    # Past the lease the agent is already not routable, before the job runs.
    active = [
        a["agent_id"]
        for a in api.get("/api/v1/agents", params={"status": "active"}).json()["results"]
    ]
    assert active == ["stays"]
    agents_expire_task.apply(throw=True)
    brief = api.get("/api/v1/agents/brief").json()
    assert brief["status"] == "expired" and not brief["routable"]
    assert api.post("/api/v1/agents/brief/heartbeat").status_code == 404


@pytest.mark.django_db
def test_list_query_count_is_flat(django_assert_max_num_queries, admin_token):
    client = DjangoClient(HTTP_AUTHORIZATION=f"Bearer {admin_token}")
    owner, _ = make_client(["register"], name="owner")
    from tests.services_helpers import actor_of

    for i in range(3):
        services.agent_register(actor=actor_of(owner), agent_id=f"a-{i}", card=card_03())
    with django_assert_max_num_queries(4) as small:
        assert client.get("/api/v1/agents").status_code == 200
    for i in range(3, 30):
        services.agent_register(actor=actor_of(owner), agent_id=f"a-{i}", card=card_03())
    with django_assert_max_num_queries(len(small.captured_queries)):
        r = client.get("/api/v1/agents")
        assert r.status_code == 200 and r.json()["count"] == 30


def test_openapi_schema(api: httpx.Client):
    r = api.get("/api/schema/", headers={"Accept": "application/vnd.oai.openapi+json"})
    assert r.status_code == 200
    assert "/api/v1/agents" in r.text or "/api/v1/agents/" in r.text


def test_card_inside_a_json_body_is_stored_byte_exact(api: httpx.Client):
    """The card member is kept as the client wrote it (spacing, key order, escapes), on SQLite
    and PostgreSQL alike, and /card answers exactly those bytes."""
    card = (
        b'{ "url": "http://127.0.0.1:9/",\n  "name": "Exact \\u00e9",'
        b'  "securitySchemes": {"bearerAuth": {"type": "http"}, "oauth2": {"type": "oauth2"}},'
        b'\n  "skills": [ ] }'
    )
    body = b'{"agent_id": "exact-card",\n "card": ' + card + b',\n "ttl_seconds": 60}'
    r = api.post("/api/v1/agents", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 201, r.text
    assert r.json()["card_sha256"] == hashlib.sha256(card).hexdigest()
    assert list(r.json()["card"]["securitySchemes"]) == ["bearerAuth", "oauth2"]
    served = api.get("/api/v1/agents/exact-card/card")
    assert served.content == card
    patched = card.replace(b"Exact", b"Patched")
    r = api.patch(
        "/api/v1/agents/exact-card",
        content=b'{"card":' + patched + b"}",
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 200, r.text
    assert api.get("/api/v1/agents/exact-card/card").content == patched
