"""Card fetches (registration by URL) and discovery's clients under the one outbound policy:
the private CA of ``A2A_OUTBOUND_CA_FILE`` and the connect-time address check reach them too."""

from __future__ import annotations

import httpx
import orjson
import pytest
import trustme

from discovery import http as discovery_http
from registry import services
from registry.card_fetch import CardFetchError, fetch_card_bytes
from registry.permissions import SYSTEM
from tests.servers import serve_app

CARD = {
    "name": "tls-card",
    "description": "behind a private CA",
    "version": "1",
    "url": "https://127.0.0.1/",
    "protocolVersion": "0.3.0",
    "capabilities": {},
    "defaultInputModes": ["text/plain"],
    "defaultOutputModes": ["text/plain"],
    "skills": [],
}


async def card_app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    body = orjson.dumps(CARD)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def private_ca_server(tmp_path):
    """A card server whose certificate a private CA issued; answers (url, ca_file)."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file, ca_file = tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "ca.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    with serve_app(
        card_app, lifespan="off", ssl_certfile=str(cert_file), ssl_keyfile=str(key_file)
    ) as server:
        yield server.url, str(ca_file)


# --- card fetch at registration -------------------------------------------------------------


def test_agent_behind_a_private_ca_can_be_registered_by_url(db, private_ca_server, settings):
    url, ca_file = private_ca_server
    settings.A2A_OUTBOUND_CA_FILE = ""
    with pytest.raises(CardFetchError, match="(?i)certificate"):
        fetch_card_bytes(url + "/")
    settings.A2A_OUTBOUND_CA_FILE = ca_file
    agent, created = services.agent_register(actor=SYSTEM, agent_id="private-ca", url=url + "/")
    assert created and agent.card["name"] == "tls-card"


def test_card_fetch_checks_the_address_at_connect_time(fake_dns):
    fake_dns["card.rebind.test"] = "169.254.169.254"
    with pytest.raises(CardFetchError, match="refused address 169.254.169.254"):
        fetch_card_bytes("http://card.rebind.test:8080/")


# --- discovery ----------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_discovery_fetches_trust_the_private_ca(private_ca_server, settings, transport):
    url, ca_file = private_ca_server
    settings.DISCOVERY_HTTP_TRANSPORT = transport
    settings.A2A_OUTBOUND_CA_FILE = ca_file  # rebuilds discovery's clients

    async def get() -> httpx.Response:
        response = await discovery_http.async_client().get(url + "/.well-known/agent-card.json")
        await response.aread()
        return response

    assert discovery_http.run(get(), timeout=20).json()["name"] == "tls-card"
    assert discovery_http.sync_client().get(url + "/").json()["name"] == "tls-card"
    settings.A2A_OUTBOUND_CA_FILE = ""
    with pytest.raises(httpx.ConnectError, match="(?i)certificate"):
        discovery_http.sync_client().get(url + "/")


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
@pytest.mark.parametrize(
    "host", ["[::ffff:169.254.169.254]", "[2002:a9fe:a9fe::1]", "169.254.169.254"]
)
def test_discovery_refuses_unsafe_addresses_at_connect_time(settings, transport, host):
    settings.DISCOVERY_HTTP_TRANSPORT = transport
    settings.A2A_OUTBOUND_CA_FILE = ""  # a fresh client for this transport

    async def get() -> httpx.Response:
        return await discovery_http.async_client().get(f"http://{host}:80/card.json")

    with pytest.raises(httpx.ConnectError, match="refused"):
        discovery_http.run(get(), timeout=20)
    with pytest.raises(httpx.ConnectError, match="refused"):
        discovery_http.sync_client().get(f"http://{host}:80/card.json")


def test_discovery_sync_client_checks_names_at_connect_time(fake_dns):
    fake_dns["registry.rebind.test"] = "169.254.169.254"
    with pytest.raises(httpx.ConnectError, match="refused address 169.254.169.254"):
        discovery_http.sync_client().get("http://registry.rebind.test:8080/api/v1/agents")


def test_proxy_setting_carries_card_fetches_and_discovery(db, settings):
    """``A2A_OUTBOUND_PROXY``: card fetches and discovery's clients go through it (a raw-socket
    forward proxy here, answering for the agent)."""
    import socket

    from tests.outbound.rawagent import RawAgent, response

    def proxy_script(conn: socket.socket, agent: RawAgent) -> None:
        while agent.take_request(conn):
            conn.sendall(response(orjson.dumps(CARD)))

    with RawAgent(proxy_script) as proxy:
        settings.A2A_OUTBOUND_PROXY = f"http://127.0.0.1:{proxy.port}"
        assert orjson.loads(fetch_card_bytes("http://agent.invalid/"))["name"] == "tls-card"
        assert proxy.requests[0].startswith(
            b"GET http://agent.invalid/.well-known/agent-card.json HTTP/1.1"
        )
        discovery_http.sync_client().get("http://registry.invalid/api/v1/agents")
        assert proxy.requests[-1].startswith(b"GET http://registry.invalid/api/v1/agents ")
        settings.DISCOVERY_HTTP_TRANSPORT = "aiohttp"
        settings.A2A_OUTBOUND_PROXY = f"http://127.0.0.1:{proxy.port}"

        async def get() -> httpx.Response:
            return await discovery_http.async_client().get("http://cards.invalid/card.json")

        assert discovery_http.run(get(), timeout=20).status_code == 200
        assert proxy.requests[-1].startswith(b"GET http://cards.invalid/card.json ")
