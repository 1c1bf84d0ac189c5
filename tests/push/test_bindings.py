"""The relay on the HTTP+JSON and gRPC bindings: a config in a call forwarded to the agent's
own HTTP+JSON interface, translated to its JSON-RPC, or passed through to its own gRPC server
is kept and rewritten the same way, and the SDK agent's pushes reach the caller's webhook.
(JSON-RPC, both versions: tests/push/test_relay.py.)"""

from __future__ import annotations

import asyncio
import os
import time

import grpc
import httpx
import pytest
from a2a.compat.v0_3 import a2a_v0_3_pb2 as pb03
from a2a.compat.v0_3 import a2a_v0_3_pb2_grpc as grpc03
from a2a.types import a2a_pb2
from a2a.types import a2a_pb2_grpc as grpc10

from push.models import RelayedConfig
from tests.a2a_agents import user_message
from tests.gateway import test_grpc_binding as grpc_tests
from tests.gateway.test_grpc_binding import auth, on_node, status_of
from tests.push.test_relay import PUSHES
from tests.push.webhooks import db, verified_claims, wait_for

_grpc_listener = grpc_tests._grpc_listener  # the node's gRPC listener on a free port
grpc_address = grpc_tests.grpc_address


def _delivered_in_order(webhook, name: str, live_server_url: str) -> None:
    got = wait_for(lambda: len(webhook.delivered(name)) >= PUSHES and webhook.delivered(name),
                   what=f"the pushes to {name}")
    assert [verified_claims(live_server_url, r)["seq"] for r in got] == \
        list(range(1, PUSHES + 1))
    assert all(r.headers["x-a2a-notification-token"] == "caller-token" for r in got)


@pytest.mark.parametrize("interfaces", [
    [("HTTP+JSON", "1.0"), ("JSONRPC", "1.0")],  # forwarded to its HTTP+JSON interface
    None,  # translated to its JSON-RPC
], ids=["forwarded", "translated"])
async def test_http_json_calls_are_relayed(echo_agent_factory, register_agent, caller,
                                           webhook, live_server_url, interfaces):
    agent = echo_agent_factory(card_shape="both", interfaces=interfaces, push=True, steps=2,
                               step_delay=0.05)
    target = register_agent(agent)
    name = f"rest-{os.urandom(3).hex()}"
    body = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "task r"}]},
            "configuration": {"taskPushNotificationConfig": {"url": webhook.url(name),
                                                             "token": "caller-token"}}}
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(f"{target.gateway_base}message:send", json=body,
                                   headers={**caller.auth, "A2A-Version": "1.0"})
    assert response.status_code == 200, response.text
    assert webhook.url(name) not in str([r.body for r in agent.requests])
    stored = await db(lambda: RelayedConfig.objects.get(agent_id=target.agent_id))
    assert stored.url == webhook.url(name)
    _delivered_in_order(webhook, name, live_server_url)


@pytest.mark.parametrize("passthrough", [False, True], ids=["translated", "passthrough"])
async def test_grpc_calls_are_relayed(grpc_address, echo_agent_factory, register_agent, caller,
                                      webhook, live_server_url, settings, passthrough):
    settings.A2A_PUSH_RELAY_BASE_URL = live_server_url  # a gRPC caller names no HTTP host
    interfaces = [("GRPC", "1.0"), ("JSONRPC", "1.0")] if passthrough else None
    agent = echo_agent_factory(card_shape="1.0", interfaces=interfaces, push=True, steps=2,
                               step_delay=0.05)
    target = register_agent(agent)
    name = f"grpc-{os.urandom(3).hex()}"
    request = a2a_pb2.SendMessageRequest(tenant=target.agent_id,
                                         message=user_message("task g").message)
    config = request.configuration.task_push_notification_config
    config.url, config.token = webhook.url(name), "caller-token"
    config.authentication.scheme, config.authentication.credentials = "Bearer", "hook-cred"

    async def call():
        server = await agent.serve_grpc() if passthrough else None
        try:
            async with grpc.aio.insecure_channel(grpc_address) as channel:
                await grpc10.A2AServiceStub(channel).SendMessage(
                    request, metadata=tuple(auth(caller).items()))
            await asyncio_wait(lambda: len(webhook.delivered(name)) >= PUSHES)
        finally:
            if server is not None:
                await server.stop(None)

    await on_node(call())
    stored = await db(lambda: RelayedConfig.objects.get(agent_id=target.agent_id))
    assert (stored.url, stored.token, stored.authentication) == (
        webhook.url(name), "caller-token", {"scheme": "Bearer", "credentials": "hook-cred"})
    assert bool(agent.grpc_calls) == passthrough
    _delivered_in_order(webhook, name, live_server_url)
    assert all(r.headers["authorization"] == "Bearer hook-cred"
               for r in webhook.delivered(name))


async def asyncio_wait(condition, timeout: float = 15.0) -> None:
    """Wait on the node's loop (the agent's gRPC server runs there) for ``condition``."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


async def test_a_grpc_call_without_a_relay_base_is_refused_naming_the_setting(
        grpc_address, echo_agent_factory, register_agent, caller, webhook):
    target = register_agent(echo_agent_factory(card_shape="1.0"))
    request = a2a_pb2.SendMessageRequest(tenant=target.agent_id,
                                         message=user_message("hi").message)
    request.configuration.task_push_notification_config.url = webhook.url("nobase")

    async def call():
        async with grpc.aio.insecure_channel(grpc_address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await grpc10.A2AServiceStub(channel).SendMessage(
                    request, metadata=tuple(auth(caller).items()))
        return refused.value

    error = await on_node(call())
    code, executed, info = status_of(error)
    assert (code, executed, info["kind"]) == (grpc.StatusCode.INVALID_ARGUMENT, "false",
                                              "webhook_refused")
    assert "A2A_PUSH_RELAY_BASE_URL" in error.details()
    assert not await db(RelayedConfig.objects.filter(agent_id=target.agent_id).exists)


async def test_a_03_grpc_call_passed_through_is_relayed(
        grpc_address, echo_agent_factory, register_agent, caller, webhook, live_server_url,
        settings):
    """A 0.3 caller and an agent serving its own 0.3 gRPC: the caller's bytes are forwarded,
    re-serialized with the config pointing at the relay."""
    settings.A2A_PUSH_RELAY_BASE_URL = live_server_url
    agent = echo_agent_factory(card_shape="0.3", interfaces=[("GRPC", "0.3"), ("JSONRPC", "0.3")],
                               push=True, steps=2, step_delay=0.05)
    target = register_agent(agent)
    name = f"grpc03-{os.urandom(3).hex()}"
    request = pb03.SendMessageRequest(
        request=pb03.Message(message_id="m-1", role=pb03.ROLE_USER,
                             content=[pb03.Part(text="task old")]),
        configuration=pb03.SendMessageConfiguration(push_notification=pb03.PushNotificationConfig(
            url=webhook.url(name), token="caller-token",
            authentication=pb03.AuthenticationInfo(schemes=["Bearer"], credentials="c03"))))
    metadata = (*auth(caller).items(), ("tenant", target.agent_id))

    async def call():
        server = await agent.serve_grpc("0.3")
        try:
            async with grpc.aio.insecure_channel(grpc_address) as channel:
                await grpc03.A2AServiceStub(channel).SendMessage(request, metadata=metadata)
            await asyncio_wait(lambda: len(webhook.delivered(name)) >= PUSHES)
        finally:
            await server.stop(None)

    await on_node(call())
    assert [path for path, _ in agent.grpc_calls] == ["/a2a.v1.A2AService/SendMessage"]
    stored = await db(lambda: RelayedConfig.objects.get(agent_id=target.agent_id))
    assert (stored.url, stored.token) == (webhook.url(name), "caller-token")
    _delivered_in_order(webhook, name, live_server_url)
    assert all(r.headers["authorization"] == "Bearer c03" for r in webhook.delivered(name))


@pytest.mark.parametrize("route", ["translated", "passthrough", "other-grpc"])
async def test_grpc_config_answers_show_the_caller_its_own_webhook(
        grpc_address, echo_agent_factory, register_agent, api, caller, webhook,
        live_server_url, settings, route):
    """gRPC create, get and list answers (the agent's, naming the relay) reach the caller with
    its own URL, token and authentication: translated from the agent's JSON-RPC answer, the
    agent's own protobuf answer decoded, rewritten and re-encoded, or translated from a
    gRPC-only agent's 0.3 gRPC answer."""
    settings.A2A_PUSH_RELAY_BASE_URL = live_server_url
    passthrough = route != "translated"
    shape, interfaces = {"translated": ("1.0", None),
                         "passthrough": ("1.0", [("GRPC", "1.0"), ("JSONRPC", "1.0")]),
                         "other-grpc": ("0.3", [("GRPC", "0.3")])}[route]
    agent = echo_agent_factory(card_shape=shape, interfaces=interfaces, push=True)
    if route == "other-grpc":  # registered with its card alone: its endpoint is its gRPC
        tenant = f"grpc03-{os.urandom(3).hex()}"
        made = api.post("/api/v1/agents", json={"agent_id": tenant,
                                                "card": agent.card_document})
        assert made.status_code == 201, made.text
    else:
        tenant = register_agent(agent).agent_id
    url = webhook.url(f"grpc-set-{os.urandom(3).hex()}")
    answers = []

    async def call():
        server = await agent.serve_grpc(shape) if passthrough else None
        try:
            async with grpc.aio.insecure_channel(grpc_address) as channel:
                stub, metadata = grpc10.A2AServiceStub(channel), tuple(auth(caller).items())
                request = a2a_pb2.SendMessageRequest(
                    tenant=tenant, message=user_message("wait for pushes").message)
                request.configuration.return_immediately = True
                task_id = (await stub.SendMessage(request, metadata=metadata)).task.id
                config = a2a_pb2.TaskPushNotificationConfig(
                    tenant=tenant, task_id=task_id, id="mine", url=url, token="caller-token")
                config.authentication.scheme = "Bearer"
                config.authentication.credentials = "hook-cred"
                answers.append(await stub.CreateTaskPushNotificationConfig(
                    config, metadata=metadata))
                answers.append(await stub.GetTaskPushNotificationConfig(
                    a2a_pb2.GetTaskPushNotificationConfigRequest(
                        tenant=tenant, task_id=task_id, id="mine"), metadata=metadata))
                listed = await stub.ListTaskPushNotificationConfigs(
                    a2a_pb2.ListTaskPushNotificationConfigsRequest(
                        tenant=tenant, task_id=task_id), metadata=metadata)
                answers.extend(listed.configs)
                await stub.CancelTask(a2a_pb2.CancelTaskRequest(tenant=tenant, id=task_id),
                                      metadata=metadata)
        finally:
            if server is not None:
                await server.stop(None)

    await on_node(call())
    assert bool(agent.grpc_calls) == passthrough
    assert len(answers) == 3
    for answer in answers:
        assert (answer.url, answer.token, answer.authentication.scheme,
                answer.authentication.credentials) == (url, "caller-token", "Bearer",
                                                       "hook-cred"), answer
    stored = await db(lambda: RelayedConfig.objects.get(agent_id=tenant))
    assert stored.url == url


async def test_a_03_grpc_config_answer_passed_through_shows_the_caller_its_own_webhook(
        grpc_address, echo_agent_factory, register_agent, caller, webhook, live_server_url,
        settings):
    """A 0.3 caller and an agent serving its own 0.3 gRPC: the 0.3 protobuf answers are
    decoded, shown with the caller's URL, token and authentication (0.3 shape), re-encoded."""
    settings.A2A_PUSH_RELAY_BASE_URL = live_server_url
    agent = echo_agent_factory(card_shape="0.3", interfaces=[("GRPC", "0.3"), ("JSONRPC", "0.3")],
                               push=True)
    target = register_agent(agent)
    url = webhook.url(f"grpc03-set-{os.urandom(3).hex()}")
    metadata = (*auth(caller).items(), ("tenant", target.agent_id))
    answers = []

    async def call():
        server = await agent.serve_grpc("0.3")
        try:
            async with grpc.aio.insecure_channel(grpc_address) as channel:
                stub = grpc03.A2AServiceStub(channel)
                sent = await stub.SendMessage(pb03.SendMessageRequest(
                    request=pb03.Message(message_id="m-2", role=pb03.ROLE_USER,
                                         content=[pb03.Part(text="wait for pushes")]),
                    configuration=pb03.SendMessageConfiguration(blocking=False)),
                    metadata=metadata)
                task = f"tasks/{sent.task.id}"
                answers.append(await stub.CreateTaskPushNotificationConfig(
                    pb03.CreateTaskPushNotificationConfigRequest(
                        parent=task, config_id="mine", config=pb03.TaskPushNotificationConfig(
                            name=f"{task}/pushNotificationConfigs/mine",
                            push_notification_config=pb03.PushNotificationConfig(
                                id="mine", url=url, token="caller-token",
                                authentication=pb03.AuthenticationInfo(
                                    schemes=["Bearer"], credentials="c03")))),
                    metadata=metadata))
                answers.append(await stub.GetTaskPushNotificationConfig(
                    pb03.GetTaskPushNotificationConfigRequest(
                        name=f"{task}/pushNotificationConfigs/mine"), metadata=metadata))
                listed = await stub.ListTaskPushNotificationConfig(
                    pb03.ListTaskPushNotificationConfigRequest(parent=task), metadata=metadata)
                answers.extend(listed.configs)
                await stub.CancelTask(pb03.CancelTaskRequest(name=task), metadata=metadata)
        finally:
            await server.stop(None)

    await on_node(call())
    assert "/a2a.v1.A2AService/GetTaskPushNotificationConfig" in [
        path for path, _ in agent.grpc_calls]
    assert len(answers) == 3
    for answer in answers:
        config = answer.push_notification_config
        assert (config.url, config.token, list(config.authentication.schemes),
                config.authentication.credentials) == (url, "caller-token", ["Bearer"],
                                                       "c03"), answer
