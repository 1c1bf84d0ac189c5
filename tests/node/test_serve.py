"""`manage.py serve` and `create_client` as a user runs them: real processes, fresh data dir."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.registry.cards import card_03
from tests.servers import ROOT, free_port
from tests.servers import fresh_env as _env
from tests.servers import run_manage as _manage
from tests.servers import wait_for_ok as _wait_for

# What this checks does not depend on the pass's database or channel layer.
pytestmark = pytest.mark.one_pass("distributed")


@pytest.mark.parametrize("server", ["daphne", "uvicorn"])
def test_serve_fresh_embedded_node(tmp_path, server):
    env = _env(tmp_path, A2A_EXPIRY_INTERVAL_SECONDS="0.3")
    _manage(env, "migrate", "--no-input")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port), "--server", server],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_for(base + "/healthz", proc)
        assert httpx.get(base + "/readyz").json()["checks"] == {"database": "ok", "broker": "ok"}
        # The bootstrap admin token is printed once on the first start of an empty database.
        output = ""
        deadline = time.monotonic() + 5
        while not ("Bearer " in output and "serving on" in output) \
                and time.monotonic() < deadline:
            output += proc.stdout.readline()
        token = re.search(r"Authorization: Bearer (\S+)", output).group(1)
        # Without NODE_ID the node serves as host:port of its --port.
        assert f"Node {socket.gethostname()}:{port} (embedded)" in output
        headers = {"Authorization": f"Bearer {token}"}
        r = httpx.post(base + "/api/v1/agents", headers=headers,
                       json={"agent_id": "short-lived", "card": card_03(), "ttl_seconds": 1})
        assert r.status_code == 201, r.text
        # The in-process periodic job (the beat schedule's expiry task) expires it.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status = httpx.get(base + "/api/v1/agents/short-lived", headers=headers).json()
            if status["status"] == "expired":
                break
            time.sleep(0.2)
        assert status["status"] == "expired"
    finally:
        proc.terminate()
        output_after = proc.communicate(timeout=15)[0]
    # A clean stop on SIGTERM: Daphne exits 0; uvicorn shuts down gracefully, then re-raises
    # the signal it caught (its documented behaviour), so it ends "killed by SIGTERM".
    expected = 0 if server == "daphne" else -signal.SIGTERM
    assert proc.returncode == expected, output_after


@pytest.mark.parametrize("server", ["daphne", "uvicorn"])
def test_a_node_refuses_connections_until_it_has_started(tmp_path, server):
    """The port listens only once the node is up: a client (or load balancer) reaching a
    node that is still starting -- a rolling restart -- is refused at once and goes elsewhere,
    instead of waiting out the startup on a port that accepts and answers nothing."""
    env = _env(tmp_path)
    _manage(env, "migrate", "--no-input")
    port = free_port()
    log = tmp_path / "node.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--port", str(port), "--server", server],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        refused = 0
        while True:
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                refused += 1
                time.sleep(0.01)
        # The first accepted connection comes after the node's startup finished.
        assert "gateway node" in log.read_text() and " up: " in log.read_text(), log.read_text()
        assert refused > 0  # it was starting for a while, refusing
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.parametrize("server", ["daphne", "uvicorn"])
def test_serve_grpc_port_serves_the_grpc_binding_on_the_nodes_loop(tmp_path, server):
    """``serve --grpc-port``: the node's gRPC listener runs on the server's own event loop
    (Daphne's reactor, uvicorn's uvloop) and takes calls the gateway's one way; SIGTERM stops
    it with the node. A port already taken stops ``serve`` at once."""
    import grpc
    from a2a.types import a2a_pb2, a2a_pb2_grpc

    from tests.a2a_agents import EchoAgent, user_message

    env = _env(tmp_path)
    _manage(env, "migrate", "--no-input")
    port, grpc_port = free_port(), free_port()
    if server == "daphne":  # (the check runs before either server starts)
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", grpc_port))
            busy = _manage(env, "serve", "--port", str(port), "--grpc-port", str(grpc_port),
                           check=False)
        assert busy.returncode != 0 and f"gRPC port {grpc_port} is in use" in busy.stderr
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port), "--server", server,
         "--grpc-port", str(grpc_port)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_for(base + "/healthz", proc)
        output = ""
        while "Bearer " not in output:
            output += proc.stdout.readline()
        token = re.search(r"Authorization: Bearer (\S+)", output).group(1)
        with EchoAgent(card_shape="both") as agent:
            r = httpx.post(base + "/api/v1/agents", headers={"Authorization": f"Bearer {token}"},
                           json={"agent_id": "grpc-echo", "url": agent.url,
                                 "card": agent.card_document})
            assert r.status_code == 201, r.text
            card = httpx.get(base + "/a2a/grpc-echo/.well-known/agent-card.json").json()
            assert {"url": f"127.0.0.1:{grpc_port}", "protocolBinding": "GRPC",
                    "protocolVersion": "1.0", "tenant": "grpc-echo"} \
                in card["supportedInterfaces"]
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                stub = a2a_pb2_grpc.A2AServiceStub(channel)
                request = a2a_pb2.SendMessageRequest(tenant="grpc-echo",
                                                     message=user_message("hi").message)
                reply, call = stub.SendMessage.with_call(
                    request, metadata=(("authorization", f"Bearer {token}"),), timeout=20)
                assert reply.message.parts[0].text == "echo: hi"
                assert ("x-a2a-executed", "true") in call.trailing_metadata()
                with pytest.raises(grpc.RpcError) as refused:
                    stub.SendMessage(request, timeout=20)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    with pytest.raises(OSError):  # stopped with the node
        socket.create_connection(("127.0.0.1", grpc_port), timeout=1).close()


def test_serve_refuses_unmigrated_database(tmp_path):
    result = _manage(_env(tmp_path), "serve", "--port", str(free_port()), check=False)
    assert result.returncode != 0
    assert "unapplied migrations" in result.stderr and "migrate" in result.stderr


def test_create_client_prints_token_last(tmp_path):
    env = _env(tmp_path)
    _manage(env, "migrate", "--no-input")
    result = _manage(env, "create_client", "ci bot", "--scopes", "register,call",
                     "--agents", "a-1,b-2")
    token = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"[A-Za-z0-9]{8}\.[A-Za-z0-9]{32}", token)
    assert "not shown again" in result.stderr
    bad = _manage(env, "create_client", "x", "--scopes", "root", check=False)
    assert bad.returncode != 0 and "scopes must be among" in bad.stderr


def test_admin_assets_are_served(live_server_url):
    r = httpx.get(live_server_url + "/static/admin/css/base.css")
    assert r.status_code == 200 and "text/css" in r.headers["content-type"]
    assert httpx.get(live_server_url + "/static/nope.css").status_code == 404


def test_waiting_for_a_node_tells_its_own_answer_from_another_process_on_its_port(tmp_path):
    """Test plumbing CI depends on: a port from ``free_port`` can be taken by another process
    (CI's other pass) before a node subprocess binds it. ``wait_until_serving`` must not take
    that process's ``/healthz`` for the node's: it raises ``PortTaken`` (the node stopped on
    ``port N is in use``) so the caller retries on another port."""
    from tests.servers import PortTaken, listens_on, serve_app, wait_until_serving

    async def healthy(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"status": "ok"}'})

    env = _env(tmp_path)
    _manage(env, "migrate", "--no-input")
    with serve_app(healthy, lifespan="off") as squatter:
        port = int(squatter.url.rsplit(":", 1)[1])
        assert listens_on(os.getpid(), port)  # the squatter is this test process
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--port", str(port), "--server", "uvicorn"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        try:
            with pytest.raises(PortTaken, match=f"port {port} is in use"):
                wait_until_serving(proc, squatter.url, timeout=60, what="node")
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
