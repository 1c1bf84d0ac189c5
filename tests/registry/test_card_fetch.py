"""Registration by URL fetches the agent's own card, over a running node with real HTTP
servers on loopback: where the A2A convention puts it for the URL given, never another
agent's card (the host root's, the node's own), and only a document that is a card."""

from __future__ import annotations

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from registry.models import Agent
from tests.a2a_agents import running_echo_agent
from tests.registry.cards import card_03
from tests.servers import serve_app


def _catch_all_html():
    """A web site answering every path with its HTML index and 200 (a SPA's catch-all)."""

    async def index(request):
        return HTMLResponse("<!doctype html><html><body>Welcome</body></html>")

    return Starlette(routes=[Route("/{path:path}", index)])


def _serving(documents: dict[str, bytes]):
    """Serves ``documents`` (path -> JSON body) and 404 elsewhere."""

    async def serve(request):
        body = documents.get(request.url.path)
        if body is None:
            return Response(b'{"error": "not found"}', 404, media_type="application/json")
        return Response(body, media_type="application/json")

    return Starlette(routes=[Route("/{path:path}", serve)])


def _refused(api: httpx.Client, agent_id: str, url: str) -> str:
    r = api.post("/api/v1/agents", json={"agent_id": agent_id, "url": url})
    assert r.status_code == 400, r.text
    assert not Agent.objects.filter(agent_id=agent_id).exists()
    return r.json()["error"]


def test_a_catch_all_html_page_is_not_a_card(api: httpx.Client):
    with serve_app(_catch_all_html(), lifespan="off") as site:
        error = _refused(api, "html-site", site.url + "/")
    assert f"{site.url}/.well-known/agent-card.json answered HTTP 200 text/html, " \
           "not an A2A card (not JSON)" in error


def test_the_nodes_own_healthz_does_not_borrow_the_nodes_card(api: httpx.Client,
                                                              live_server_url: str):
    """The node's root card names the node, not ``/healthz/``: refused, saying so."""
    assert api.get("/.well-known/agent-card.json").status_code == 200  # there is a root card
    error = _refused(api, "healthz", live_server_url + "/healthz/")
    assert f"{live_server_url}/healthz/.well-known/agent-card.json answered HTTP 404" in error
    assert f"{live_server_url}/.well-known/agent-card.json is the card of another agent" in error
    assert f"not {live_server_url}/healthz/" in error


@pytest.mark.parametrize(
    ("body", "found"),
    [
        (b"{}", "a JSON object without a name"),
        (b"[1, 2]", "JSON, but an array, not an object"),
        (b"null", "JSON, but null, not an object"),
        (b'{"name": "x", "description": "no endpoint"}', "a JSON object without a url or an "
                                                           "interface"),
        (b'{"name": " ", "url": "http://127.0.0.1:9/"}', "a JSON object without a name"),
    ],
)
def test_a_json_document_that_is_not_a_card_is_refused(api: httpx.Client, body, found):
    with serve_app(_serving({"/.well-known/agent-card.json": body}), lifespan="off") as site:
        error = _refused(api, "not-a-card", site.url + "/")
    assert "answered HTTP 200 application/json, not an A2A card (" + found + ")" in error


def test_an_agent_under_a_path_gets_the_card_under_that_path(api: httpx.Client):
    documents = {"/.well-known/agent-card.json": orjson.dumps(card_03(name="Root Agent")),
                 "/team/echo/.well-known/agent-card.json": orjson.dumps(card_03(name="Team"))}
    with serve_app(_serving(documents), lifespan="off") as site:
        r = api.post("/api/v1/agents", json={"agent_id": "team-echo",
                                             "url": site.url + "/team/echo/"})
    assert r.status_code == 201, r.text
    assert r.json()["name"] == "Team" and r.json()["url"] == site.url + "/team/echo/"


def test_the_root_card_is_taken_only_when_it_names_the_url(api: httpx.Client):
    """An SDK agent whose JSON-RPC endpoint is ``/rpc`` serves its card at the root, naming
    ``/rpc``: registering ``/rpc`` takes it; registering another path does not."""
    with running_echo_agent(rpc_path="/rpc") as agent:
        r = api.post("/api/v1/agents", json={"agent_id": "rpc-echo", "url": agent.url})
        assert r.status_code == 201, r.text
        assert r.json()["name"] == "Echo Agent" and r.json()["url"] == agent.url
        error = _refused(api, "elsewhere", agent.base_url + "/elsewhere/")
    assert "is the card of another agent" in error and agent.url in error


def test_a_url_naming_a_card_is_fetched_as_it_is(api: httpx.Client):
    """A card URL: the card at that address, and the agent's endpoint is the card's own."""
    with running_echo_agent() as agent:
        card_url = agent.base_url + "/.well-known/agent-card.json"
        r = api.post("/api/v1/agents", json={"agent_id": "by-card-url", "url": card_url})
        assert r.status_code == 201, r.text
        assert r.json()["url"] == agent.url
    with serve_app(_serving({"/cards/echo.json": orjson.dumps(card_03(name="Filed"))}),
                   lifespan="off") as site:
        r = api.post("/api/v1/agents", json={"agent_id": "filed",
                                             "url": site.url + "/cards/echo.json"})
        assert r.status_code == 201, r.text
        assert r.json()["name"] == "Filed" and r.json()["url"] == "http://127.0.0.1:9/"
        error = _refused(api, "missing-card", site.url + "/cards/missing.json")
    assert f"{site.url}/cards/missing.json answered HTTP 404" in error
