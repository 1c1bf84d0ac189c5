"""An https agent: the gateway verifies its certificate, trusting A2A_OUTBOUND_CA_FILE."""

from __future__ import annotations

import httpx
import orjson
import pytest
import trustme

from tests.conftest import make_client
from tests.gateway.test_proxy import ScriptedAgent, register
from tests.servers import serve_app

# Every test runs with both outbound clients (tests/gateway/conftest.py).
pytestmark = pytest.mark.usefixtures("outbound_client")


@pytest.fixture
def https_agent(tmp_path):
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    upstream = ScriptedAgent()
    with serve_app(upstream, ssl_certfile=str(cert_file), ssl_keyfile=str(key_file)) as server:
        upstream.url = server.url + "/rpc"
        yield upstream, str(ca_file)


def _call(base: str, token: str) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 7, "method": "message/send", "params": {"mode": "echo"}}
    return httpx.post(f"{base}/a2a/tls-agent", content=orjson.dumps(body),
                      headers={"Authorization": f"Bearer {token}",
                               "Content-Type": "application/json"}, timeout=30)


def test_https_agent_with_trusted_ca(live_server_url, https_agent, settings):
    upstream, ca_file = https_agent
    settings.A2A_OUTBOUND_CA_FILE = ca_file
    register("tls-agent", upstream.url)
    _, token = make_client(["call"])
    r = _call(live_server_url, token)
    assert r.status_code == 200, r.text
    assert r.headers["x-a2a-executed"] == "true"
    assert r.json()["result"]["method"] == "message/send"
    assert upstream.arrived and upstream.arrived[-1].path == "/rpc"


def test_https_agent_with_untrusted_certificate_is_unreachable(live_server_url, https_agent,
                                                                settings):
    upstream, _ = https_agent
    settings.A2A_OUTBOUND_CA_FILE = ""
    register("tls-agent", upstream.url)
    _, token = make_client(["call"])
    r = _call(live_server_url, token)
    assert r.status_code == 200
    assert r.headers["x-a2a-executed"] == "false"
    error = r.json()["error"]
    assert error["data"]["kind"] == "unreachable" and error["data"]["retryable"] is True
    assert "certificate" in error["message"].lower()
    assert not upstream.arrived
