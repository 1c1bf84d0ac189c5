"""The rewritten agent card at ``/a2a/{agent_id}/.well-known/agent-card.json``."""

from __future__ import annotations

import httpx
import orjson

from registry import services
from registry.permissions import SYSTEM
from tests.conftest import make_client

AGENT_URL = "http://127.0.0.1:9/agent"
CARD_10 = {
    "name": "Both Shapes",
    "description": "A 1.0 card with 0.3 fields merged in.",
    "version": "1.0.0",
    "url": AGENT_URL,
    "protocolVersion": "0.3.0",
    "preferredTransport": "JSONRPC",
    "additionalInterfaces": [{"url": AGENT_URL, "transport": "JSONRPC"},
                             {"url": "http://127.0.0.1:9/grpc", "transport": "GRPC"}],
    "supportedInterfaces": [
        {"url": AGENT_URL, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
        {"url": "http://127.0.0.1:9/rest", "protocolBinding": "HTTP+JSON",
         "protocolVersion": "1.0"},
    ],
    "capabilities": {"streaming": True},
    "defaultInputModes": ["text/plain"],
    "defaultOutputModes": ["text/plain"],
    "skills": [{"id": "s", "name": "S", "description": "d", "tags": ["t"]}],
    "signatures": [{"protected": "abc", "signature": "def"}],
}


def card_url(base: str, agent_id: str) -> str:
    return f"{base}/a2a/{agent_id}/.well-known/agent-card.json"


def all_urls(card: dict) -> list[str]:
    urls = [card["url"]] if "url" in card else []
    for key in ("supportedInterfaces", "additionalInterfaces"):
        urls += [i["url"] for i in card.get(key) or []]
    return urls


def test_every_endpoint_rewritten_with_etag(live_server_url):
    services.agent_register(actor=SYSTEM, agent_id="card-agent", card=CARD_10)
    r = httpx.get(card_url(live_server_url, "card-agent"))
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    card = r.json()
    urls = all_urls(card)
    # url, the JSON-RPC entries and the HTTP+JSON one: the gateway answers no other binding
    assert len(urls) == 4
    assert set(urls) == {f"{live_server_url}/a2a/card-agent/"}
    assert "127.0.0.1:9" not in r.text
    # nothing but the interfaces changed
    for key in ("name", "skills", "signatures", "capabilities", "protocolVersion"):
        assert card[key] == CARD_10[key]
    assert [i["protocolBinding"] for i in card["supportedInterfaces"]] == ["JSONRPC", "HTTP+JSON"]
    assert [i["transport"] for i in card["additionalInterfaces"]] == ["JSONRPC"]
    assert card["preferredTransport"] == "JSONRPC"
    etag = r.headers["etag"]
    assert etag.startswith('"') and r.headers["cache-control"].startswith("public")
    r2 = httpx.get(card_url(live_server_url, "card-agent"), headers={"If-None-Match": etag})
    assert r2.status_code == 304 and r2.content == b"" and r2.headers["etag"] == etag
    r3 = httpx.get(card_url(live_server_url, "card-agent"),
                   headers={"If-None-Match": '"other", W/' + etag})
    assert r3.status_code == 304
    assert httpx.get(card_url(live_server_url, "card-agent"),
                     headers={"If-None-Match": '"stale"'}).status_code == 200
    # a new card: new bytes, new ETag
    services.agent_register(actor=SYSTEM, agent_id="card-agent",
                            card={**CARD_10, "description": "changed"})
    r4 = httpx.get(card_url(live_server_url, "card-agent"), headers={"If-None-Match": etag})
    assert r4.status_code == 200 and r4.json()["description"] == "changed"
    assert r4.headers["etag"] != etag
    # the older well-known name answers too
    legacy = httpx.get(f"{live_server_url}/a2a/card-agent/.well-known/agent.json")
    assert legacy.status_code == 200 and legacy.json()["url"].endswith("/a2a/card-agent/")


def test_a2a_10_card_without_url_gets_none_added(live_server_url):
    card = {k: v for k, v in CARD_10.items()
            if k not in ("url", "protocolVersion", "preferredTransport", "additionalInterfaces")}
    services.agent_register(actor=SYSTEM, agent_id="card-10", card=card)
    body = httpx.get(card_url(live_server_url, "card-10")).json()
    assert "url" not in body
    assert {i["url"] for i in body["supportedInterfaces"]} == {
        f"{live_server_url}/a2a/card-10/"}


def test_base_url_setting_and_trusted_proxies(live_server_url, settings):
    services.agent_register(actor=SYSTEM, agent_id="proxied", card=CARD_10)
    forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "gw.example.com"}
    # untrusted: X-Forwarded-Host ignored, the Host header is used. (X-Forwarded-Proto is left
    # out here: the test server is a stock uvicorn, whose own proxy-header handling believes
    # 127.0.0.1; `manage.py serve` turns that off so A2A_TRUSTED_PROXIES alone decides.)
    body = httpx.get(card_url(live_server_url, "proxied"),
                     headers={"X-Forwarded-Host": "gw.example.com"}).json()
    assert body["url"] == f"{live_server_url}/a2a/proxied/"
    settings.A2A_TRUSTED_PROXIES = ["127.0.0.0/8"]
    # A forwarded host is believed only when this node answers to it (ALLOWED_HOSTS).
    body = httpx.get(card_url(live_server_url, "proxied"), headers=forwarded).json()
    assert body["url"] == f"https://{live_server_url.split('//')[1]}/a2a/proxied/"
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "gw.example.com"]
    r = httpx.get(card_url(live_server_url, "proxied"), headers=forwarded)
    assert r.json()["url"] == "https://gw.example.com/a2a/proxied/"
    assert r.headers["vary"] == "Host, X-Forwarded-Host, X-Forwarded-Proto"
    # a hostile Host never lands in the card
    r = httpx.get(card_url(live_server_url, "proxied"),
                  headers={"Host": 'evil"host<script>', "X-Forwarded-Host": "a b"})
    assert r.status_code == 200 and "<script>" not in r.text
    settings.A2A_PUBLIC_BASE_URL = "https://public.example.org"
    r = httpx.get(card_url(live_server_url, "proxied"), headers=forwarded)
    assert set(all_urls(r.json())) == {"https://public.example.org/a2a/proxied/"}
    assert "vary" not in r.headers  # the same card for every Host


def test_host_outside_allowed_hosts_never_reaches_a_cacheable_card(live_server_url):
    services.agent_register(actor=SYSTEM, agent_id="hosted", card=CARD_10)
    port = live_server_url.rsplit(":", 1)[1]
    r = httpx.get(card_url(live_server_url, "hosted"), headers={"Host": "attacker.example"})
    assert r.status_code == 200
    assert r.headers["cache-control"].startswith("public") and r.headers["vary"] == "Host"
    assert "attacker.example" not in r.text
    assert set(all_urls(r.json())) == {f"http://127.0.0.1:{port}/a2a/hosted/"}
    r = httpx.get(card_url(live_server_url, "hosted"), headers={"Host": f"localhost:{port}"})
    assert set(all_urls(r.json())) == {f"http://localhost:{port}/a2a/hosted/"}


# Key order a client may read meaning into (the first security scheme); PostgreSQL's jsonb
# would answer oauth2 before bearerAuth (shorter keys first) and reorder the top level too.
ORDERED_CARD = (
    b'{"name": "Ordered", "url": "http://127.0.0.1:9/agent", "version": "1.0.0",\n'
    b' "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"},\n'
    b'   "oauth2": {"type": "oauth2", "flows": {}}},\n'
    b' "security": [{"bearerAuth": []}], "skills": [], "capabilities": {},\n'
    b' "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"],\n'
    b' "description": "Keys in a deliberate order."}'
)


def test_card_served_from_stored_bytes_with_key_order_kept(live_server_url, admin_token):
    """On SQLite and on PostgreSQL (the suite's distributed run): the gateway's card keeps the
    registered key order with only URLs rewritten; the API's card is the registered bytes."""
    services.agent_register(actor=SYSTEM, agent_id="ordered", card=ORDERED_CARD)
    original = orjson.loads(ORDERED_CARD)
    r = httpx.get(card_url(live_server_url, "ordered"))
    served = orjson.loads(r.content)
    # The agent lists no HTTP+JSON interface: the gateway's (translated) comes last.
    assert list(served) == [*original, "additionalInterfaces"]
    assert list(served["securitySchemes"]) == ["bearerAuth", "oauth2"]
    gateway = f"{live_server_url}/a2a/ordered/"
    assert served == {**original, "url": gateway,
                      "additionalInterfaces": [{"url": gateway, "transport": "HTTP+JSON"}]}
    raw = httpx.get(f"{live_server_url}/api/v1/agents/ordered/card",
                    headers={"Authorization": f"Bearer {admin_token}"})
    assert raw.content == ORDERED_CARD


def test_card_errors_and_token_setting(live_server_url, settings):
    r = httpx.get(card_url(live_server_url, "no-card-here"))
    assert r.status_code == 404
    assert r.json()["error"]["data"]["kind"] == "agent_not_found"
    services.agent_register(actor=SYSTEM, agent_id="private-card", card=CARD_10)
    settings.A2A_CARDS_REQUIRE_TOKEN = True
    assert httpx.get(card_url(live_server_url, "private-card")).status_code == 401
    _, token = make_client(["call"])
    r = httpx.get(card_url(live_server_url, "private-card"),
                  headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200 and r.headers["cache-control"].startswith("private")
    _, other = make_client(["call"], agents=["someone-else"])
    assert httpx.get(card_url(live_server_url, "private-card"),
                     headers={"Authorization": f"Bearer {other}"}).status_code == 403
    assert httpx.post(card_url(live_server_url, "private-card")).status_code == 405


def test_card_reflects_registry_not_stale_cache(live_server_url):
    """Rewritten bytes are cached per card hash; a re-registered card is served at once."""
    services.agent_register(actor=SYSTEM, agent_id="cache-card", card=CARD_10)
    first = httpx.get(card_url(live_server_url, "cache-card")).json()
    services.agent_register(actor=SYSTEM, agent_id="cache-card",
                            card={**CARD_10, "name": "Renamed"})
    second = httpx.get(card_url(live_server_url, "cache-card")).json()
    assert first["name"] == "Both Shapes" and second["name"] == "Renamed"
    services.agent_deregister(actor=SYSTEM, agent_id="cache-card")
    assert httpx.get(card_url(live_server_url, "cache-card")).status_code == 404
    assert orjson.loads(orjson.dumps(second))  # valid JSON bytes
