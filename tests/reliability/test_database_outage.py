"""Fault matrix, PostgreSQL rows: the private PostgreSQL is killed -9 under a
running node (private Redis too, distributed mode) and restarted.

* calls keep flowing with verified tokens while the database is down (stale window), each
  reaching the agent exactly once; a token never verified gets ``auth_unavailable`` (503,
  retryable, executed false); revocations are honoured once the database is back;
* every other surface answers a JSON 503 with Retry-After, fast; /readyz names the database;
* the node recovers by itself once the database returns;
* ``/mcp`` lists and calls from the node's memory meanwhile;
* push-config answers (relay on) withhold every relay secret meanwhile.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import orjson
import pytest

from tests.a2a_agents import EchoAgent
from tests.mcp_bridge.clients import all_tools, run
from tests.reliability.conftest import register, rpc_ids_received
from tests.servers import free_port

pytestmark = pytest.mark.timeout(180)

#: Loose bound on any answer during the outage (the target is 2 s; the old behaviour was 22 to
#: 33 s). Not a speed test: it proves nothing waits out pool timeouts one after another.
ANSWER_BOUND_SECONDS = 5.0


def _send(rpc_id: str) -> dict:
    return {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": "message/send",
        "params": {
            "message": {
                "role": "user",
                "messageId": rpc_id,
                "parts": [{"kind": "text", "text": "hi"}],
            }
        },
    }


async def _calls(url: str, token: str, ids: list[str]) -> list[tuple[httpx.Response, float]]:
    async with httpx.AsyncClient(timeout=30) as client:

        async def one(rpc_id: str):
            started = time.monotonic()
            response = await client.post(
                url, json=_send(rpc_id), headers={"Authorization": f"Bearer {token}"}
            )
            return response, time.monotonic() - started

        return await asyncio.gather(*(one(i) for i in ids))


def test_gateway_calls_survive_a_database_outage(pg, tokens, start_node, agent):
    node = start_node(A2A_AUTH_CACHE_SECONDS="0.5")
    agent_id = register(node.url, tokens["admin"], agent.url)
    url = f"{node.url}/a2a/{agent_id}"
    warm = asyncio.run(_calls(url, tokens["caller"], ["warm"]))
    assert warm[0][0].status_code == 200

    pg.kill()
    time.sleep(1.0)  # the cache entry lapses: every call now needs a (failing) lookup
    ids = [f"outage-{n}" for n in range(60)]
    results = []
    for chunk in range(3):  # three waves across the outage
        results += asyncio.run(_calls(url, tokens["caller"], ids[chunk * 20 : (chunk + 1) * 20]))
        time.sleep(0.3)
    for response, elapsed in results:
        assert response.status_code == 200, response.text
        assert response.headers["x-a2a-executed"] == "true"
        assert "result" in response.json(), response.text
        assert elapsed < ANSWER_BOUND_SECONDS
    received = [i for i in rpc_ids_received(agent) if str(i).startswith("outage-")]
    assert sorted(received) == sorted(ids)  # 0 lost, 0 duplicated

    # A token never verified cannot be checked: a documented, retryable JSON-RPC error.
    ((response, elapsed),) = asyncio.run(_calls(url, tokens["late"], ["late-1"]))
    assert response.status_code == 503
    assert response.headers["retry-after"]
    assert response.headers["x-a2a-executed"] == "false"
    error = response.json()["error"]
    assert error["data"]["kind"] == "auth_unavailable"
    assert error["data"]["retryable"] is True and error["data"]["executed"] is False
    assert response.json()["id"] == "late-1"
    assert elapsed < ANSWER_BOUND_SECONDS
    assert "late-1" not in rpc_ids_received(agent)

    # Back: the late token works, and a revocation made meanwhile is honoured.
    pg.start()
    pg.psql("UPDATE registry_apiclient SET revoked = true WHERE client_id LIKE 'caller-%'", "a2a")
    deadline = time.monotonic() + 15
    late_ok = revoked = False
    while time.monotonic() < deadline and not (late_ok and revoked):
        late_ok = (
            late_ok
            or asyncio.run(_calls(url, tokens["late"], [f"late-{uuid.uuid4().hex[:6]}"]))[0][
                0
            ].status_code
            == 200
        )
        revoked = (
            revoked
            or asyncio.run(_calls(url, tokens["caller"], ["after"]))[0][0].status_code == 401
        )
        time.sleep(0.2)
    assert late_ok, node.log()
    assert revoked, node.log()


def _timed(method: str, url: str, **kwargs) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = httpx.request(method, url, timeout=30, **kwargs)
    return response, time.monotonic() - started


def test_every_surface_answers_json_503_and_recovers(pg, tokens, start_node, agent):
    node = start_node(A2A_AUTH_CACHE_SECONDS="0.5")
    auth = {"Authorization": f"Bearer {tokens['admin']}"}
    agent_id = register(node.url, tokens["admin"], agent.url)

    pg.kill()

    async def onset() -> list[tuple[int, float]]:
        # Concurrent requests as the outage begins: none queues behind another's pool wait.
        async with httpx.AsyncClient(timeout=30, headers=auth) as client:

            async def one(path: str):
                started = time.monotonic()
                response = await client.get(node.url + path)
                return response.status_code, time.monotonic() - started

            return await asyncio.gather(*(one(p) for p in ["/api/v1/agents", "/agents"] * 4))

    for status, elapsed in asyncio.run(onset()):
        assert status == 503 and elapsed < ANSWER_BOUND_SECONDS, (status, elapsed)
    time.sleep(0.6)
    surfaces = [
        ("POST", f"/api/v1/agents/{agent_id}/heartbeat", {}),
        ("POST", "/agents/heartbeat", {"json": {"agent_id": agent_id}}),
        (
            "POST",
            "/api/v1/agents",
            {
                "json": {
                    "agent_id": "new-one",
                    "url": agent.url,
                    "card": {"name": "n", "url": agent.url},
                }
            },
        ),
        (
            "POST",
            "/agents/register",
            {"json": {"agent_id": "new-two", "name": "n", "url": agent.url}},
        ),
        ("GET", "/api/v1/agents", {}),
        ("GET", "/agents", {}),
        ("GET", f"/api/v1/agents/{agent_id}", {}),
        ("DELETE", f"/agents/{agent_id}", {}),
    ]
    for _ in range(2):  # the first round meets the outage, the second the open breaker
        for method, path, kwargs in surfaces:
            response, elapsed = _timed(method, node.url + path, headers=auth, **kwargs)
            assert response.status_code == 503, (path, response.status_code, response.text)
            assert response.headers["content-type"].startswith("application/json"), path
            assert int(response.headers["retry-after"]) >= 1
            assert "database unavailable" in response.json()["error"]
            assert elapsed < ANSWER_BOUND_SECONDS, (path, elapsed)

    response, elapsed = _timed("GET", node.url + "/readyz")
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["database"].startswith("unreachable") and checks["broker"] == "ok"
    assert elapsed < ANSWER_BOUND_SECONDS
    assert httpx.get(node.url + "/healthz").status_code == 200

    pg.start()
    back = time.monotonic()
    while True:
        response = httpx.post(
            f"{node.url}/api/v1/agents/{agent_id}/heartbeat", headers=auth, timeout=30
        )
        if response.status_code == 200:
            break
        assert time.monotonic() - back < 15, (response.status_code, response.text)
        time.sleep(0.05)
    recovered = time.monotonic() - back
    print(f"node recovered {recovered:.2f}s after the database came back")
    assert httpx.get(node.url + "/readyz").status_code == 200
    assert httpx.get(f"{node.url}/api/v1/agents/{agent_id}", headers=auth).status_code == 200


def test_gateway_calls_survive_a_stalled_database(pg, tokens, start_node, agent):
    """PostgreSQL frozen with SIGSTOP (connections open, nothing answers: no error ever comes
    back): token lookups give up after their timeout and verified tokens keep serving."""
    node = start_node(A2A_AUTH_CACHE_SECONDS="0.5")
    agent_id = register(node.url, tokens["admin"], agent.url)
    url = f"{node.url}/a2a/{agent_id}"
    assert asyncio.run(_calls(url, tokens["caller"], ["warm"]))[0][0].status_code == 200
    pg.pause()
    try:
        time.sleep(0.8)
        ids = [f"stall-{n}" for n in range(30)]
        results = []
        for chunk in range(3):
            results += asyncio.run(
                _calls(url, tokens["caller"], ids[chunk * 10 : (chunk + 1) * 10])
            )
            time.sleep(0.5)
        ready, elapsed = _timed("GET", node.url + "/readyz")
    finally:
        pg.resume()
    for response, took in results:
        assert response.status_code == 200, response.text
        assert took < ANSWER_BOUND_SECONDS
    assert sorted(i for i in rpc_ids_received(agent) if str(i).startswith("stall-")) == sorted(ids)
    assert ready.status_code == 503 and elapsed < ANSWER_BOUND_SECONDS
    assert ready.json()["checks"]["database"].startswith("unreachable")


def test_an_outage_is_logged_as_lines_not_unretrieved_futures(pg, tokens, start_node, agent):
    """PostgreSQL stopped for a few seconds under calls (token lookups that time out while the
    driver's pool still waits), heartbeats, registrations, reads and /readyz: every background
    failure is handled -- no "Future exception was never retrieved" traceback in the node's
    log -- and the outage shows as lines saying so."""
    node = start_node(A2A_AUTH_CACHE_SECONDS="0.5", LOG_LEVEL="INFO")
    auth = {"Authorization": f"Bearer {tokens['admin']}"}
    agent_id = register(node.url, tokens["admin"], agent.url)
    url = f"{node.url}/a2a/{agent_id}"
    assert asyncio.run(_calls(url, tokens["caller"], ["warm"]))[0][0].status_code == 200

    pg.kill()
    try:
        time.sleep(0.6)  # verified entries lapse: every call now needs a (failing) lookup
        stop = time.monotonic() + 8  # the node's periodic expiry (every 5 s) fails twice
        wave = 0
        while time.monotonic() < stop:
            wave += 1
            asyncio.run(_calls(url, tokens["caller"], [f"log-{wave}-{n}" for n in range(10)]))
            # a token never verified: its lookup runs into the driver's pool timeout
            asyncio.run(_calls(url, tokens["late"], [f"late-{wave}"]))
            for method, path in (("POST", f"/api/v1/agents/{agent_id}/heartbeat"),
                                 ("GET", "/api/v1/agents"), ("GET", "/readyz")):
                httpx.request(method, node.url + path, headers=auth, timeout=30)
            time.sleep(0.2)
    finally:
        pg.start()
    back = time.monotonic() + 20
    while httpx.get(node.url + "/readyz", timeout=30).status_code != 200:
        assert time.monotonic() < back, node.log()
        time.sleep(0.2)
    while asyncio.run(_calls(url, tokens["late"], ["late-back"]))[0][0].status_code != 200:
        assert time.monotonic() < back, node.log()
        time.sleep(0.2)
    # the lookups abandoned at their timeout end within the driver's pool timeout (1.5 s)
    time.sleep(3)
    log = node.log_path.read_text(errors="replace")
    assert "never retrieved" not in log, log[-6000:]
    assert "database unreachable" in log and "database reachable again" in log, log[-4000:]
    assert log.count("token lookup failed") == 1, log[-4000:]
    assert log.count("token lookups work again") == 1, log[-4000:]
    assert log.count("periodic task registry-expire-agents (") <= 1, log[-4000:]


def test_mcp_lists_and_calls_from_memory_during_an_outage(pg, tokens, start_node, agent):
    """``/mcp`` while PostgreSQL is down: tools are listed from the routing table and the cards
    the node read before (an agent whose card it never read by its id alone), calls go through
    the gateway as ``/a2a`` calls do; what needs the database is a clear, retryable error (an
    unread card's call, a token never verified), never a 500 and never a long wait."""
    node = start_node(A2A_AUTH_CACHE_SECONDS="0.5")
    known = register(node.url, tokens["admin"], agent.url)

    async def list_and_call(client):
        listed = {tool.name: tool for tool in await all_tools(client)}
        return listed, await client.call_tool(known, {"message": "hi"})

    # The card and the token now in memory; the module's earlier agents may be listed too.
    before, _ = run(node.url, tokens["caller"], list_and_call)
    unread = register(node.url, tokens["admin"], agent.url)

    pg.kill()
    time.sleep(1.0)  # the token's cache entry lapses: only the stale window serves it now
    answers = {}
    for mode in ("auto", "legacy"):
        started = time.monotonic()
        answers[mode] = run(node.url, tokens["caller"], list_and_call, mode=mode), \
            time.monotonic() - started

    async def call_unread(client):
        return await client.call_tool(unread, {"message": "hi"})

    unread_call = run(node.url, tokens["caller"], call_unread)
    late, elapsed = _timed("POST", f"{node.url}/mcp", json={
        "jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers={
        "Authorization": f"Bearer {tokens['late']}",
        "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28"})

    for mode, ((listed, result), seconds) in answers.items():
        print(f"MCP session ({mode}) during the outage: {seconds:.2f}s")
        # ours all there, nothing the node did not know of (an earlier agent may have expired)
        assert {known, unread, "get_task"} <= set(listed) <= set(before) | {unread}, mode
        assert listed[known].title == "Fault agent"  # from the card read before the outage
        assert listed[unread].title == unread
        assert listed[unread].input_schema["required"] == ["message"]
        assert not result.is_error and result.content[0].text == "echo: hi", (mode, result)
        assert seconds < 3 * ANSWER_BOUND_SECONDS, (mode, seconds)
    assert unread_call.is_error
    assert unread_call.structured_content == {
        "agent_id": unread, "kind": "registry_unavailable", "executed": False, "retryable": True}
    assert late.status_code == 503 and int(late.headers["retry-after"]) >= 1
    assert late.json()["error"]["data"]["kind"] == "auth_unavailable"
    assert elapsed < ANSWER_BOUND_SECONDS

    # Back: the card is read, the call goes through.
    pg.start()
    deadline = time.monotonic() + 15
    while True:
        unread_call = run(node.url, tokens["caller"], call_unread)
        if not unread_call.is_error:
            break
        assert time.monotonic() < deadline, (unread_call, node.log())
        time.sleep(0.2)
    assert unread_call.content[0].text == "echo: hi"


def _rpc(url: str, token: str | None, method: str, params: dict) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(url, timeout=15, headers=headers, json={
        "jsonrpc": "2.0", "id": uuid.uuid4().hex[:8], "method": method, "params": params})


def _configs(response: httpx.Response) -> list[dict]:
    """The push configs of a 0.3 ``tasks/pushNotificationConfig/get`` or ``list`` answer."""
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    answers = result if isinstance(result, list) else [result]
    return [answer["pushNotificationConfig"] for answer in answers]


def test_push_config_answers_withhold_relay_secrets_during_an_outage(
        pg, tokens, start_node):
    """Relay on: a caller's config on a running task is shown back as the caller set it; while
    PostgreSQL is down its get/list answers (200) name the relay's URL and carry no ``token``:
    the relay's secret the agent answers with never reaches the caller, since the gateway
    cannot tell whose config it is; the caller's own URL and token show again once it is
    back."""
    node = start_node(A2A_AUTH_CACHE_SECONDS="120", A2A_PUSH_RELAY="true")
    hook = f"http://127.0.0.1:{free_port()}/hook/mine"
    with EchoAgent(push=True) as pusher:
        agent_id = register(node.url, tokens["admin"], pusher.url)
        url = f"{node.url}/a2a/{agent_id}"
        sent = _rpc(url, tokens["caller"], "message/send", {
            "message": {"role": "user", "messageId": uuid.uuid4().hex,
                        "parts": [{"kind": "text", "text": "wait for pushes"}]},
            "configuration": {"blocking": False}})
        assert sent.status_code == 200, sent.text
        task_id = sent.json()["result"]["id"]
        config = {"id": "mine", "url": hook, "token": "caller-token"}
        made = _rpc(url, tokens["caller"], "tasks/pushNotificationConfig/set",
                    {"taskId": task_id, "pushNotificationConfig": config})
        get = ("tasks/pushNotificationConfig/get",
               {"id": task_id, "pushNotificationConfigId": "mine"})
        listed = ("tasks/pushNotificationConfig/list", {"id": task_id})

        # The agent holds the relay's URL and secret, and answers them to whoever asks it.
        [arrived] = pusher.recorder.rpc("tasks/pushNotificationConfig/set")
        relayed = orjson.loads(arrived.body)["params"]["pushNotificationConfig"]
        secret = relayed["token"]
        assert relayed["url"].startswith(f"{node.url}/push/") and secret != "caller-token"
        assert _configs(_rpc(pusher.url, None, *get)) == [{**relayed, "id": "mine"}]
        for answer in (made, _rpc(url, tokens["caller"], *get),
                       _rpc(url, tokens["caller"], *listed)):
            assert _configs(answer) == [config]

        pg.kill()
        # Twice each: whichever of the relay's threads (and its connection) takes the read.
        for method, params in (get, listed) * 2:
            answer = _rpc(url, tokens["caller"], method, params)
            assert secret.encode() not in answer.content, answer.text
            assert _configs(answer) == [{"id": "mine", "url": relayed["url"]}], answer.text

        pg.start()
        deadline = time.monotonic() + 15
        while _configs(_rpc(url, tokens["caller"], *get)) != [config]:
            assert time.monotonic() < deadline, node.log()
            time.sleep(0.2)
        assert _configs(_rpc(url, tokens["caller"], *listed)) == [config]
        _rpc(pusher.url, None, "tasks/cancel", {"id": task_id})
