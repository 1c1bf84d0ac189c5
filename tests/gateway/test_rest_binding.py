"""The A2A HTTP+JSON (REST) binding through the gateway, with real SDK peers.

The agent is the SDK's own server (tests/a2a_agents.py) serving JSON-RPC and HTTP+JSON (under
``/rest``, 0.3 routes under ``/rest/v1/``); callers are stock SDK clients restricted to
HTTP+JSON, pointed at the gateway's base ``/a2a/{agent_id}/``: they read the gateway's card,
find its HTTP+JSON interface and call the gateway's REST routes, which the gateway forwards to
the agent's HTTP+JSON interface URL. Each test asserts what the caller got and what arrived at
the agent.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from urllib.parse import unquote

import httpx
import pytest
from a2a.client.errors import A2AClientError
from a2a.helpers import get_message_text
from a2a.types import GetTaskRequest, TaskNotFoundError, TaskState
from a2a.utils.errors import MethodNotFoundError

from tests.a2a_agents import (
    HTTP_JSON_BINDING,
    JSONRPC_BINDING,
    echo_get_and_cancel,
    sdk_client,
    send_and_collect,
    transport_name,
    user_message,
)

# protocol version -> (the agent's interfaces, the SDK transport a REST client picks, the path
# prefix of the agent's REST routes)
VERSIONS = {
    "1.0": ([(HTTP_JSON_BINDING, "1.0"), (JSONRPC_BINDING, "1.0")], "RestTransport", "/rest"),
    "0.3": ([(HTTP_JSON_BINDING, "0.3"), (JSONRPC_BINDING, "0.3")], "CompatRestTransport",
            "/rest/v1"),
}


#: The SDK agent answers 1.0 routes only to callers naming the version (its 0.3 routes, under
#: v1/, to callers naming none or 0.3).
V10 = {"A2A-Version": "1.0"}


def rest_agent(echo_agent_factory, version: str = "1.0", **kwargs):
    interfaces, _, _ = VERSIONS[version]
    return echo_agent_factory(card_shape="0.3" if version == "0.3" else "both",
                              interfaces=interfaces, **kwargs)


def agent_calls(agent) -> list[tuple[str, str]]:
    """The HTTP+JSON requests the agent received: (method, path)."""
    return [(r.http_method, r.path) for r in agent.requests if r.path.startswith("/rest")]


def rest_error(response: httpx.Response) -> tuple[int, str, str]:
    """(HTTP status, google.rpc status, gateway kind) of a gateway error in REST form."""
    error = response.json()["error"]
    assert error["code"] == response.status_code, error
    [info] = error["details"]
    assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
    assert info["reason"] == info["metadata"]["kind"].upper()
    return response.status_code, error["status"], info["metadata"]["kind"]


@pytest.mark.usefixtures("outbound_client")
@pytest.mark.parametrize("version", list(VERSIONS))
async def test_rest_client_sends_streams_gets_and_cancels_through_the_gateway(
        gateway_path, echo_agent_factory, register_agent, caller, version):
    agent = rest_agent(echo_agent_factory, version)
    target = register_agent(agent)
    _, transport, prefix = VERSIONS[version]
    responses: list[httpx.Response] = []

    async with sdk_client(target.gateway_base, bindings=[HTTP_JSON_BINDING], streaming=False,
                          polling=True, headers=caller.auth, responses=responses) as client:
        assert transport_name(client) == transport
        # The agent's own error reaches the SDK as it does directly (1.0: TaskNotFound; the
        # 0.3 REST transport reads the agent's 404 as MethodNotFound).
        task_id = await echo_get_and_cancel(
            client, TaskNotFoundError if version == "1.0" else MethodNotFoundError)
    async with sdk_client(target.gateway_base, bindings=[HTTP_JSON_BINDING], streaming=True,
                          headers=caller.auth, responses=responses) as client:
        events = await send_and_collect(client, "task streamed")

    assert [a.kind for a in events] == \
        ["task", "status_update"] + ["artifact_update"] * 4 + ["status_update"]
    assert [a.event.artifact_update.artifact.parts[0].text for a in events[2:-1]] == \
        [f"chunk {i}: task streamed" for i in range(4)]
    assert events[-1].event.status_update.status.state == TaskState.TASK_STATE_COMPLETED
    async with sdk_client(agent.base_url, bindings=[HTTP_JSON_BINDING],
                          streaming=False) as direct:
        with pytest.raises(TaskNotFoundError if version == "1.0" else MethodNotFoundError):
            await direct.get_task(GetTaskRequest(id="no-such-task"))
    agent.recorder.requests[-1:] = []  # that direct call
    assert agent.executor.cancelled == [task_id]
    assert agent_calls(agent) == [
        ("POST", f"{prefix}/message:send"), ("POST", f"{prefix}/message:send"),
        ("GET", f"{prefix}/tasks/{task_id}"), ("POST", f"{prefix}/tasks/{task_id}:cancel"),
        ("GET", f"{prefix}/tasks/no-such-task"), ("POST", f"{prefix}/message:stream"),
    ]
    assert [r.path for r in agent.requests if r.path == "/"] == []  # never its JSON-RPC URL
    calls = [r for r in responses if ".well-known" not in r.request.url.path]
    assert len(calls) == 6 and all(r.headers["x-a2a-executed"] == "true" for r in calls)
    [stream] = [r for r in calls if r.request.url.path.endswith("message:stream")]
    assert stream.headers["content-type"].startswith("text/event-stream")
    assert stream.headers["x-a2a-agent-status"] == "200"


async def test_resubscribe_streams_a_running_task(echo_agent_factory, register_agent, caller):
    """``GET tasks/{id}:subscribe`` (a stream decided by its route, with no body)."""
    agent = rest_agent(echo_agent_factory, steps=6, step_delay=0.3)
    target = register_agent(agent)
    async with sdk_client(target.gateway_base, bindings=[HTTP_JSON_BINDING], streaming=True,
                          headers=caller.auth) as client:
        stream = client.send_message(user_message("task long"))
        first = await anext(stream)
        task_id = first.task.id
        async with httpx.AsyncClient(timeout=30) as http:
            async with http.stream("GET", f"{target.gateway_base}tasks/{task_id}:subscribe",
                                   headers={**caller.auth, **V10}) as response:
                assert response.status_code == 200, await response.aread()
                assert response.headers["content-type"].startswith("text/event-stream")
                assert response.headers["x-a2a-executed"] == "true"
                body = b""
                async for piece in response.aiter_bytes():
                    body += piece
        async for _ in stream:
            pass
    assert b"TASK_STATE_COMPLETED" in body and b"chunk 5: task long" in body
    assert ("GET", f"/rest/tasks/{task_id}:subscribe") in agent_calls(agent)


async def test_client_preferring_rest_picks_it_from_the_served_card(echo_agent_factory,
                                                                    register_agent, caller):
    agent = echo_agent_factory(interfaces=[(JSONRPC_BINDING, "1.0"), (HTTP_JSON_BINDING, "1.0")])
    target = register_agent(agent)
    card = httpx.get(f"{target.gateway_base}.well-known/agent-card.json").json()
    assert card["supportedInterfaces"] == [
        {"url": target.gateway_base, "protocolBinding": b, "protocolVersion": "1.0"}
        for b in (JSONRPC_BINDING, HTTP_JSON_BINDING)]
    # The card's order: JSON-RPC first.
    async with sdk_client(target.gateway_base, bindings=[HTTP_JSON_BINDING, JSONRPC_BINDING],
                          headers=caller.auth, streaming=False) as client:
        assert transport_name(client) == "JsonRpcTransport"
    # The client's own preference: HTTP+JSON, which the gateway answers.
    async with sdk_client(target.gateway_base, bindings=[HTTP_JSON_BINDING, JSONRPC_BINDING],
                          client_preference=True, headers=caller.auth,
                          streaming=False) as client:
        assert transport_name(client) == "RestTransport"
        [reply] = await send_and_collect(client, "preferred")
    assert get_message_text(reply.event.message) == "echo: preferred"
    assert agent_calls(agent) == [("POST", "/rest/message:send")]


# --- every route, the same through the gateway as directly ------------------------------------


ROUTES = [
    ("GET", "tasks", None),
    ("GET", "tasks?pageSize=2&status=TASK_STATE_WORKING", None),
    ("GET", "tasks/nope", None),
    ("GET", "tasks/n%20o%2Bpe", None),
    ("POST", "tasks/nope:cancel", {}),
    ("GET", "tasks/nope:subscribe", None),
    ("POST", "tasks/nope/pushNotificationConfigs",
     {"taskId": "nope", "url": "http://127.0.0.1:9/hook"}),
    ("GET", "tasks/nope/pushNotificationConfigs", None),
    ("GET", "tasks/nope/pushNotificationConfigs/c1", None),
    ("DELETE", "tasks/nope/pushNotificationConfigs/c1", None),
    ("GET", "extendedAgentCard", None),
    ("GET", "v1/card", None),
    ("GET", "v1/tasks/nope", None),
    ("POST", "message:send", {"message": "not a message"}),
    ("POST", "tenant-1/message:send", {}),
]


@pytest.mark.usefixtures("outbound_client")
async def test_every_route_answers_as_the_agent_does_directly(echo_agent_factory,
                                                              register_agent, caller):
    """Each route of the binding (1.0, 0.3 under v1/, a tenant prefix, a query string), with
    bodies the agent refuses or ids it does not know: through the gateway the caller gets
    exactly what the agent answers directly, and the agent gets the same method and path."""
    agent = rest_agent(echo_agent_factory)
    target = register_agent(agent)
    async with httpx.AsyncClient(timeout=30) as http:
        statuses = set()
        for method, path, body in ROUTES:
            kwargs = {"json": body} if body is not None else {}
            version = {} if path.startswith("v1/") else V10
            direct = await http.request(method, f"{agent.rest_url}/{path}", headers=version,
                                        **kwargs)
            statuses.add(direct.status_code)
            seen = len(agent.requests)
            via = await http.request(method, f"{target.gateway_base}{path}",
                                     headers={**caller.auth, **version}, **kwargs)
            where = f"{method} {path}"
            assert (via.status_code, via.content) == (direct.status_code, direct.content), where
            assert via.headers["x-a2a-executed"] == "true", where
            assert via.headers["x-a2a-agent-status"] == str(direct.status_code), where
            [forwarded] = agent.requests[seen:]
            assert (forwarded.http_method, forwarded.path) == \
                (method, "/rest/" + unquote(path.split("?")[0])), where
            assert forwarded.header("authorization") is None  # the gateway token stays here
            assert forwarded.header("x-kubemq-caller-id") == caller.client_id
            assert forwarded.header("a2a-version") == version.get("A2A-Version")
    assert {200, 400, 404} <= statuses  # answers, refusals and unknown ids among them


# --- the gateway's own errors, in the binding's form --------------------------------------------


async def test_gateway_errors_in_rest_form(echo_agent_factory, register_agent, caller,
                                          live_server_url, settings):
    agent = rest_agent(echo_agent_factory)
    target = register_agent(agent, max_concurrency=1)
    json_rpc_only = register_agent(echo_agent_factory())  # its card lists no HTTP+JSON
    base = f"{live_server_url}/a2a"
    send = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}
    async with httpx.AsyncClient(timeout=30) as http:
        missing = await http.post(f"{base}/no-such-agent/message:send", json=send,
                                  headers=caller.auth)
        assert rest_error(missing) == (404, "NOT_FOUND", "agent_not_found")
        assert missing.headers["x-a2a-executed"] == "false"
        anonymous = await http.post(f"{target.gateway_base}message:send", json=send)
        assert rest_error(anonymous) == (401, "UNAUTHENTICATED", "unauthenticated")
        assert anonymous.headers["www-authenticate"].startswith("Bearer")
        no_route = await http.get(f"{target.gateway_base}nothing/here", headers=caller.auth)
        assert rest_error(no_route) == (404, "NOT_FOUND", "route_not_found")
        wrong = await http.put(f"{target.gateway_base}message:send", headers=caller.auth)
        assert rest_error(wrong) == (405, "UNIMPLEMENTED", "method_not_allowed")
        assert wrong.headers["allow"] == "POST"
        garbage = await http.post(f"{target.gateway_base}message:send", content=b"{nope",
                                  headers={**caller.auth, "content-type": "application/json"})
        assert rest_error(garbage) == (400, "INVALID_ARGUMENT", "parse_error")
        # An agent without HTTP+JSON is called in translation (tests/gateway/test_rest_translate.py)
        # and its card offers the gateway's HTTP+JSON after its own interfaces.
        translated = await http.post(f"{json_rpc_only.gateway_base}message:send", json=send,
                                     headers=caller.auth)
        assert translated.status_code == 200, translated.text
        assert translated.json()["message"]["parts"] == [{"text": "echo: hi"}]
        card = (await http.get(f"{json_rpc_only.gateway_base}.well-known/agent-card.json")).json()
        assert [i["protocolBinding"] for i in card["supportedInterfaces"]] == \
            [JSONRPC_BINDING, JSONRPC_BINDING, HTTP_JSON_BINDING, HTTP_JSON_BINDING]

        # busy: the one slot is held by a running stream
        hold = {"message": {"messageId": "m2", "role": "ROLE_USER",
                            "parts": [{"text": "wait here"}]}}
        async with http.stream("POST", f"{target.gateway_base}message:stream", json=hold,
                               headers={**caller.auth, **V10}) as held:
            assert held.status_code == 200
            busy = await http.post(f"{target.gateway_base}message:send", json=send,
                                   headers=caller.auth)
            assert rest_error(busy) == (429, "RESOURCE_EXHAUSTED", "busy")
            assert busy.headers["x-a2a-executed"] == "false"
            assert busy.json()["error"]["details"][0]["metadata"]["retryable"] == "true"

        # hostile: a body over the cap never reaches the agent
        settings.A2A_MAX_REQUEST_BYTES = 4096
        big = {"message": {"messageId": "m3", "role": "ROLE_USER",
                           "parts": [{"text": "x" * 10_000}]}}
        seen = len(agent.requests)
        too_large = await http.post(f"{target.gateway_base}message:send", json=big,
                                    headers=caller.auth)
        assert rest_error(too_large) == (413, "RESOURCE_EXHAUSTED", "request_too_large")
        assert len([r for r in agent.requests[seen:] if r.path.startswith("/rest")]) == 0

    # The SDK client raises on them as on any REST error.
    with pytest.raises(A2AClientError):
        async with sdk_client(target.gateway_base, bindings=[HTTP_JSON_BINDING],
                              streaming=False) as client:  # no token
            await send_and_collect(client, "hi")


async def test_unreachable_agent_in_rest_form(echo_agent_factory, register_agent, caller):
    agent = rest_agent(echo_agent_factory)
    target = register_agent(agent)
    agent.stop()
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(f"{target.gateway_base}message:send", json={},
                                   headers=caller.auth)
    assert rest_error(response) == (502, "UNAVAILABLE", "unreachable")
    assert response.headers["x-a2a-executed"] == "false"
    await asyncio.sleep(0)


async def test_a_refused_webhook_never_reaches_the_agents_http_json_interface(
        echo_agent_factory, register_agent, caller):
    """Forwarded unchanged, an HTTP+JSON body's webhooks are checked first, in the 1.0 shape and
    the 0.3 one of the v1/ routes: a metadata address is webhook_refused, the agent never hit."""
    agent = rest_agent(echo_agent_factory)
    target = register_agent(agent)
    message = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
    url = "http://169.254.169.254/latest/meta-data/"
    bodies = [
        ("message:send", {"message": message,
                          "configuration": {"taskPushNotificationConfig": {"url": url}}}),
        ("v1/message:send", {"message": message,
                             "configuration": {"pushNotificationConfig": {"url": url}}}),
        ("tasks/t1/pushNotificationConfigs", {"taskId": "t1", "url": url}),
        ("v1/tasks/t1/pushNotificationConfigs", {"pushNotificationConfig": {"url": url}}),
    ]
    seen = len(agent.requests)
    async with httpx.AsyncClient(timeout=30) as http:
        for path, body in bodies:
            response = await http.post(f"{target.gateway_base}{path}", json=body,
                                       headers=caller.auth)
            assert rest_error(response) == (400, "INVALID_ARGUMENT", "webhook_refused"), path
            assert response.headers["x-a2a-executed"] == "false"
            assert "metadata" in response.json()["error"]["message"]
        fine = await http.post(f"{target.gateway_base}message:send", json={
            "message": message, "configuration": {
                "taskPushNotificationConfig": {"url": "http://127.0.0.1:9/hook"}}},
            headers={**caller.auth, **V10})
        assert fine.status_code == 200, fine.text
    assert len([r for r in agent.requests[seen:] if r.path.startswith("/rest")]) == 1


# --- both servers ------------------------------------------------------------------------------


@pytest.mark.one_pass("distributed")  # a node of its own: the same in both passes
@pytest.mark.parametrize("server", ["uvicorn", "daphne"])
async def test_send_and_stream_on_both_servers(echo_agent_factory, server):
    """A node served by each server (``manage.py serve --server ...``, its own process): a REST
    client's send and stream through it, the stream's events arriving as the agent sends them."""
    from tests.gateway.test_backpressure import running_node

    agent = rest_agent(echo_agent_factory, steps=4, step_delay=0.3)
    with running_node(server) as node:
        auth = {"Authorization": f"Bearer {node.token}"}
        registered = httpx.post(f"{node.url}/api/v1/agents", headers=auth, json={
            "agent_id": "rest-echo", "url": agent.url, "card": agent.card_document})
        assert registered.status_code == 201, registered.text
        base = f"{node.url}/a2a/rest-echo/"
        async with sdk_client(base, bindings=[HTTP_JSON_BINDING], streaming=False,
                              headers=auth) as client:
            assert transport_name(client) == "RestTransport"
            [reply] = await send_and_collect(client, f"on {server}")
        async with sdk_client(base, bindings=[HTTP_JSON_BINDING], headers=auth) as client:
            events = await send_and_collect(client, "task streamed")
    assert get_message_text(reply.event.message) == f"echo: on {server}"
    artifacts = [a for a in events if a.kind == "artifact_update"]
    assert [a.event.artifact_update.artifact.parts[0].text for a in artifacts] == \
        [f"chunk {i}: task streamed" for i in range(4)]
    assert events[-1].event.status_update.status.state == TaskState.TASK_STATE_COMPLETED
    # Relayed as they happen, not in one burst at the end.
    assert artifacts[-1].at - artifacts[0].at > 3 * 0.3 * 0.5
    assert agent_calls(agent) == [("POST", "/rest/message:send"), ("POST", "/rest/message:stream")]


# --- streams: the caller leaving, the agent going quiet -----------------------------------------


async def test_caller_leaving_a_rest_stream_frees_the_agents_slot(gateway_path,
                                                                 echo_agent_factory,
                                                                 register_agent, caller):
    agent = rest_agent(echo_agent_factory)
    target = register_agent(agent, max_concurrency=1)
    hold = {"message": {"messageId": "h1", "role": "ROLE_USER", "parts": [{"text": "wait"}]}}
    send = {"message": {"messageId": "s1", "role": "ROLE_USER", "parts": [{"text": "after"}]}}
    headers = {**caller.auth, **V10}
    async with httpx.AsyncClient(timeout=30) as http:
        async with http.stream("POST", f"{target.gateway_base}message:stream", json=hold,
                               headers=headers) as held:
            async for piece in held.aiter_bytes():
                if b"data:" in piece:
                    break  # the stream is running at the agent
            busy = await http.post(f"{target.gateway_base}message:send", json=send,
                                   headers=headers)
            assert rest_error(busy)[2] == "busy"
        # The caller left: the gateway closes the agent's stream and frees the slot.
        for _ in range(100):  # bounded: 10 s
            answer = await http.post(f"{target.gateway_base}message:send", json=send,
                                     headers=headers)
            if answer.status_code == 200:
                break
            assert rest_error(answer)[2] == "busy"
            await asyncio.sleep(0.1)
    assert answer.status_code == 200, answer.text
    assert answer.json()["message"]["parts"][0]["text"] == "echo: after"


async def test_quiet_agent_ends_a_rest_stream_with_an_error_event_in_rest_form(
        gateway_path, echo_agent_factory, register_agent, caller, settings):
    """A stream whose agent goes quiet past ``A2A_SSE_IDLE_TIMEOUT_SECONDS`` ends with a
    terminal ``event: error`` whose data is the binding's error (a google.rpc.Status), which
    the SDK's REST client raises."""
    settings.A2A_SSE_IDLE_TIMEOUT_SECONDS = 1
    agent = rest_agent(echo_agent_factory)
    target = register_agent(agent)
    hold = {"message": {"messageId": "q1", "role": "ROLE_USER", "parts": [{"text": "wait"}]}}
    async with httpx.AsyncClient(timeout=30) as http:
        async with http.stream("POST", f"{target.gateway_base}message:stream", json=hold,
                               headers={**caller.auth, **V10}) as response:
            assert response.status_code == 200
            body = b"".join([piece async for piece in response.aiter_bytes()])
    last = body.replace(b"\r\n", b"\n").strip().split(b"\n\n")[-1]
    assert last.startswith(b"event: error\ndata: "), body[-500:]
    error = json.loads(last.split(b"data: ", 1)[1])["error"]
    assert (error["code"], error["status"]) == (504, "DEADLINE_EXCEEDED")
    assert error["details"][0]["metadata"] == {
        "kind": "timeout", "executed": "true", "retryable": "true",
        "agent_id": target.agent_id}
    with pytest.raises(A2AClientError, match="DEADLINE_EXCEEDED"):
        async with sdk_client(target.gateway_base, bindings=[HTTP_JSON_BINDING],
                              headers=caller.auth) as client:
            await send_and_collect(client, "wait again")


async def test_timeout_metrics_and_audit_as_for_json_rpc(gateway_path, echo_agent_factory,
                                                         register_agent, caller,
                                                         live_server_url, settings):
    """The body's ``configuration.timeout`` bounds a sync call (the agent had the request:
    executed true); every call counts under its A2A method name and outcome in /metrics, and
    the failed one is in the console's call audit log."""
    from console.models import CallRecord
    from gateway import recorder
    from tests.console.test_stats_and_audit import wait_for
    from tests.gateway.test_proxy import _metric

    settings.A2A_STATS_FLUSH_SECONDS = 0.2
    recorder.reset()

    agent = rest_agent(echo_agent_factory)
    target = register_agent(agent)
    headers = {**caller.auth, **V10}
    slow = {"message": {"messageId": "t1", "role": "ROLE_USER", "parts": [{"text": "wait"}]},
            "configuration": {"timeout": 1}}
    async with httpx.AsyncClient(timeout=30) as http:
        before = (await http.get(f"{live_server_url}/metrics")).text
        timed_out = await http.post(f"{target.gateway_base}message:send", json=slow,
                                    headers=headers)
        # A body above 16 KiB (validated, but built only as far as its timeout) alike.
        slow["message"]["parts"].append({"text": "x" * 20_000})
        large = await http.post(f"{target.gateway_base}message:send", json=slow,
                                headers=headers)
        listed = await http.get(f"{target.gateway_base}tasks", headers=headers)
        after = (await http.get(f"{live_server_url}/metrics")).text
    for answer in (timed_out, large):
        assert rest_error(answer) == (504, "DEADLINE_EXCEEDED", "timeout")
        assert answer.headers["x-a2a-executed"] == "true"
    assert listed.status_code == 200 and listed.headers["x-a2a-executed"] == "true"

    def delta(name: str, **labels: str) -> float:
        return _metric(after, name, **labels) - _metric(before, name, **labels)

    total, seconds = "kubemq_a2a_requests_total", "kubemq_a2a_request_duration_seconds_count"
    assert delta(total, agent_id=target.agent_id, method="SendMessage") == 2
    assert delta(total, agent_id=target.agent_id, method="ListTasks") == 1
    assert delta(seconds, agent_id=target.agent_id, outcome="timeout") == 2
    assert delta(seconds, agent_id=target.agent_id, outcome="ok") == 1

    rows = wait_for(lambda: len(CallRecord.objects.filter(agent_id=target.agent_id)) == 2
                    and list(CallRecord.objects.filter(agent_id=target.agent_id).values(
                        "caller", "method", "outcome", "http_status")))
    recorder.reset()
    assert rows == [{"caller": caller.client_id, "method": "SendMessage", "outcome": "timeout",
                     "http_status": 504}] * 2


# --- a caller that never reads a REST stream ----------------------------------------------------


@pytest.mark.one_pass("distributed")  # a node of its own: the same in both passes
@pytest.mark.parametrize("server", ["uvicorn", "daphne"])
def test_stalled_rest_caller_is_bounded_and_gets_a_terminal_error(server):
    """The same backpressure as JSON-RPC streams (tests/gateway/test_backpressure.py): an agent
    streaming 64 KiB events as fast as it can to a REST caller that never reads writes only what
    the node's bounded relay and the kernel's buffers hold, and the caller gets a terminal
    ``stream_stalled`` error event in the binding's form; the agent's stream is closed."""
    from tests.gateway import test_backpressure as bp
    from tests.servers import read_body, serve_agent

    class RestFlood(bp.FloodAgent):
        """The flood agent's endless stream on its HTTP+JSON ``message:stream`` route."""

        async def __call__(self, scope, receive, send) -> None:
            if scope["type"] == "http" and scope["path"].endswith("/message:stream"):
                await read_body(receive)
                pending = [{"type": "http.request", "body": b'{"method": "message/stream"}'}]

                async def as_stream(pending=pending):
                    return pending.pop() if pending else await receive()

                await super().__call__(scope, as_stream, send)
                return
            await super().__call__(scope, receive, send)

    with serve_agent(RestFlood()) as flood, bp.running_node(server) as node:
        card = {"name": "flood", "url": flood.url,
                "additionalInterfaces": [{"transport": "HTTP+JSON", "url": f"{flood.url}/v"}]}
        r = httpx.post(f"{node.url}/api/v1/agents", json={
            "agent_id": "rest-flood", "url": flood.url, "card": card},
            headers={"Authorization": f"Bearer {node.token}"})
        assert r.status_code == 201, r.text
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", node.port))
        body = b'{"message": {"messageId": "f", "role": "ROLE_USER", "parts": [{"text": "x"}]}}'
        sock.sendall(
            f"POST /a2a/rest-flood/message:stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {node.token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        try:
            time.sleep(bp.STALL_SECONDS + 1.5)  # past the stall deadline
            data = bp.read_to_end(sock, timeout=20)
        finally:
            sock.close()
    assert data.startswith(b"HTTP/1.1 200")
    tail = data[-4096:]
    assert b"event: error" in tail, tail[-600:]
    assert b'"code":408' in tail and b'"reason":"STREAM_STALLED"' in tail, tail[-600:]
    assert flood.open == 0
    assert 0 < flood.sent[0] < bp.NOT_READ_ON_BYTES


async def test_credential_passthrough_and_the_kubemq_profile(echo_agent_factory, register_agent,
                                                             caller, settings):
    """An agent with credential passthrough gets the caller's own Authorization on its REST
    routes too (the caller authenticates with X-Gateway-Authorization); the ``kubemq`` error
    profile changes JSON-RPC codes only: REST errors keep the binding's form, and the agent's
    own error statuses are relayed as they are."""
    settings.A2A_ERROR_PROFILE = "kubemq"
    agent = rest_agent(echo_agent_factory)
    target = register_agent(agent, credential_passthrough=True)
    gateway_auth = {"X-Gateway-Authorization": caller.auth["Authorization"]}
    async with httpx.AsyncClient(timeout=30) as http:
        got = await http.get(f"{target.gateway_base}tasks/nope", headers={
            **gateway_auth, **V10, "Authorization": "Bearer agents-own"})
        assert got.status_code == 404 and got.json()["error"]["status"] == "NOT_FOUND"
        assert got.headers["x-a2a-executed"] == "true"
        assert agent.requests[-1].header("authorization") == "Bearer agents-own"
        assert agent.requests[-1].header("x-gateway-authorization") is None
        # Without the gateway header, the gateway refuses it (its token is not the agent's).
        refused = await http.get(f"{target.gateway_base}tasks/nope", headers=caller.auth)
        assert rest_error(refused) == (401, "UNAUTHENTICATED", "unauthenticated")
        missing = await http.get(f"{target.gateway_base[:-len(target.agent_id) - 1]}nobody/tasks",
                                 headers=caller.auth)
        assert rest_error(missing) == (404, "NOT_FOUND", "agent_not_found")


async def test_a_new_card_moves_or_ends_the_http_json_interface(echo_agent_factory,
                                                                register_agent, caller, api):
    """The agent's HTTP+JSON interface follows its card: stored at registration, replaced by a
    card update (routing tables learn it from the update event), gone with a card without one
    (the REST routes are then translated to its JSON-RPC, and the served card lists the
    gateway's HTTP+JSON after the agent's own interfaces)."""
    from registry.models import Agent

    first, second = rest_agent(echo_agent_factory), rest_agent(echo_agent_factory)
    target = register_agent(first)
    stored = await Agent.objects.filter(agent_id=target.agent_id).values_list(
        "http_json_url", flat=True).aget()
    assert stored == first.rest_url
    send = {"message": {"messageId": "n1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}
    headers = {**caller.auth, **V10}

    async def answered_by(url_agent) -> bool:
        async with httpx.AsyncClient(timeout=30) as http:
            seen = len(url_agent.requests)
            response = await http.post(f"{target.gateway_base}message:send", json=send,
                                        headers=headers)
            return response.status_code == 200 and len(url_agent.requests) > seen

    assert await answered_by(first)
    r = api.patch(f"/api/v1/agents/{target.agent_id}", json={"card": second.card_document})
    assert r.status_code == 200, r.text
    for _ in range(50):  # bounded: 5 s
        if await answered_by(second):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the new HTTP+JSON interface was never used")

    json_rpc_only = echo_agent_factory()
    r = api.patch(f"/api/v1/agents/{target.agent_id}",
                  json={"card": json_rpc_only.card_document})
    assert r.status_code == 200, r.text
    async with httpx.AsyncClient(timeout=30) as http:
        for _ in range(50):  # bounded: 5 s
            seen = len(first.recorder.rpc())
            response = await http.post(f"{target.gateway_base}message:send", json=send,
                                       headers=headers)
            if response.status_code == 200 and len(first.recorder.rpc()) > seen:
                break  # translated to the JSON-RPC endpoint the agent registered
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the REST call was never translated to JSON-RPC")
        card = (await http.get(f"{target.gateway_base}.well-known/agent-card.json")).json()
    assert [i["protocolBinding"] for i in card["supportedInterfaces"]] == \
        [JSONRPC_BINDING, JSONRPC_BINDING, "HTTP+JSON", "HTTP+JSON"]
