"""Push notifications relayed end to end: a stock a2a-sdk client sends a message with a push
config through a real node to an SDK agent pushing with the SDK's own sender; the caller's
loopback webhook gets every push, in order, with its own token and credentials, an idempotency
key and the platform's signature, verified with the JWKS the node serves."""

from __future__ import annotations

import asyncio
import os

import orjson
import pytest
from a2a.types import (
    AuthenticationInfo,
    CancelTaskRequest,
    GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest,
    SendMessageConfiguration,
    SendMessageRequest,
    TaskPushNotificationConfig,
)

from push.models import PushDelivery, RelayedConfig
from tests.a2a_agents import sdk_client, user_message
from tests.push.webhooks import db, verified_claims, wait_for, wait_in_thread

#: What the echo agent's "task" sends with ``steps=2``: the task, working, two artifact
#: updates, completed (one push each, SDK 1.x sender).
PUSHES = 5


def _request(text: str, url: str, token: str) -> SendMessageRequest:
    request = user_message(text)
    request.configuration.CopyFrom(SendMessageConfiguration(
        task_push_notification_config=TaskPushNotificationConfig(
            url=url, token=token, id="caller-config",
            authentication=AuthenticationInfo(scheme="Bearer", credentials="hook-credential"))))
    return request


async def send_task(target, caller, text: str, url: str, token: str) -> None:
    """Send ``text`` to ``target`` through the gateway as ``caller`` (the SDK's client), with a
    push config for the webhook ``url`` and ``token`` (:func:`_request`), and read the answer."""
    async with sdk_client(target.gateway_base, streaming=False, headers=caller.auth) as client:
        async for _ in client.send_message(_request(text, url, token)):
            pass


def _relayed_config(agent, method: str) -> dict:
    [arrived] = [r for r in agent.requests if r.rpc_method == method]
    params = orjson.loads(arrived.body)["params"]
    configuration = params["configuration"]
    return configuration.get("taskPushNotificationConfig") \
        or configuration["pushNotificationConfig"]


@pytest.mark.parametrize("shape,method", [("1.0", "SendMessage"), ("0.3", "message/send")])
async def test_pushes_reach_the_callers_webhook_in_order_signed(
        echo_agent_factory, register_agent, caller, webhook, live_server_url, shape, method):
    agent = echo_agent_factory(card_shape=shape, push=True, steps=2, step_delay=0.05)
    target = register_agent(agent)
    name = f"ok-{os.urandom(3).hex()}"
    await send_task(target, caller, "task relay", webhook.url(name), "caller-token")

    # The agent never saw the caller's webhook, token or credentials: the relay's instead.
    relayed = _relayed_config(agent, method)
    assert relayed["url"].startswith(f"{live_server_url}/push/")
    assert relayed["token"] not in ("", "caller-token")
    assert "authentication" not in relayed
    assert "hook-credential" not in str([r.body for r in agent.requests])
    stored = await db(lambda: RelayedConfig.objects.get(agent_id=target.agent_id))
    assert (stored.url, stored.token, stored.client_id, stored.config_id) == (
        webhook.url(name), "caller-token", caller.client_id, "caller-config")
    assert relayed["token"] not in stored.secret_sha256  # only its hash is kept

    got = wait_for(lambda: len(webhook.delivered(name)) >= PUSHES and webhook.delivered(name),
                   what="the pushes")
    assert len(got) == PUSHES
    # The last push showed the task completed: the config is purged after the retention.
    done = await db(lambda: RelayedConfig.objects.get(agent_id=target.agent_id))
    assert done.task_done_at is not None and done.last_push_at == done.task_done_at
    claims = [verified_claims(live_server_url, r) for r in got]
    task_ids = {c["task_id"] for c in claims}
    assert len(task_ids) == 1
    assert [c["seq"] for c in claims] == list(range(1, PUSHES + 1))  # in order
    assert [r.headers["x-a2a-push-sequence"] for r in got] == [str(c["seq"]) for c in claims]
    keys = [r.headers["idempotency-key"] for r in got]
    assert len(set(keys)) == PUSHES and keys == [c["jti"] for c in claims]
    assert all(c["config_id"] == "caller-config" for c in claims)
    assert all(r.headers["x-a2a-notification-token"] == "caller-token" for r in got)
    assert all(r.headers["authorization"] == "Bearer hook-credential" for r in got)
    kinds = [next(iter(orjson.loads(r.body))) for r in got]
    assert kinds[0] == "task" and kinds[-1] == "statusUpdate"
    rows = await db(lambda: list(PushDelivery.objects.filter(config=stored).order_by(
        "sequence")))
    assert [d.state for d in rows] == ["delivered"] * PUSHES
    assert all(d.latency_ms is not None and d.attempts == 1 for d in rows)


async def test_a_webhook_failing_for_a_while_gets_everything_in_order(
        echo_agent_factory, register_agent, caller, webhook, live_server_url, settings):
    settings.A2A_PUSH_MAX_ATTEMPTS = 8
    agent = echo_agent_factory(card_shape="1.0", push=True, steps=2, step_delay=0.05)
    target = register_agent(agent)
    name = f"flaky-{os.urandom(3).hex()}"
    webhook.fail_first(name, 3)
    await send_task(target, caller, "task flaky", webhook.url(name), "t")
    got = wait_for(lambda: len(webhook.delivered(name)) >= PUSHES and webhook.delivered(name),
                   what="the pushes after the webhook recovered")
    claims = [verified_claims(live_server_url, r) for r in got]
    assert [c["seq"] for c in claims] == list(range(1, PUSHES + 1))
    tried = [r for r in webhook.received if r.path.endswith(name)]
    # The first push was tried 4 times (3 refusals), its key the same each time; no later
    # push was tried before it was delivered.
    assert [r.headers["x-test-answer"] for r in tried[:4]] == ["503", "503", "503", "200"]
    assert len({r.headers["idempotency-key"] for r in tried[:4]}) == 1
    first = await db(lambda: PushDelivery.objects.get(agent_id=target.agent_id, sequence=1))
    assert (first.state, first.attempts, first.last_status) == ("delivered", 4, 200)


async def test_attempts_exhausted_are_dead_and_the_queue_goes_on(
        echo_agent_factory, register_agent, caller, webhook, settings):
    settings.A2A_PUSH_MAX_ATTEMPTS = 2
    agent = echo_agent_factory(card_shape="1.0", push=True, steps=2, step_delay=0.05)
    target = register_agent(agent)
    name = f"down-{os.urandom(3).hex()}"
    webhook.always_fail(name)
    await send_task(target, caller, "task down", webhook.url(name), "t")

    def dead():
        rows = list(PushDelivery.objects.filter(agent_id=target.agent_id).order_by("sequence"))
        return len(rows) == PUSHES and all(r.state == "dead" for r in rows) and rows

    rows = await asyncio.to_thread(wait_in_thread, dead, what="every push dead")
    assert all(r.attempts == 2 and r.last_error == "HTTP 503" and r.last_status == 503
               for r in rows)
    assert len([r for r in webhook.received if r.path.endswith(name)]) == 2 * PUSHES


def test_relay_off_forwards_the_webhook_unchanged(echo_agent_factory, register_agent, caller,
                                                   webhook, live_server_url, settings):
    """``A2A_PUSH_RELAY`` off (embedded mode's default) and the agent's ``push_relay``
    overriding it either way."""
    import httpx

    settings.A2A_PUSH_RELAY = False
    agent = echo_agent_factory(card_shape="1.0")
    plain = register_agent(agent)
    relayed = register_agent(agent, push_relay=True)
    assert relayed.registration["push_relay"] is True
    assert plain.registration["push_relay"] is None
    sent = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
        "message": {"role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "hi"}]},
        "configuration": {"taskPushNotificationConfig": {"url": webhook.url("x"),
                                                         "token": "caller-token"}}}}
    for target in (plain, relayed):
        response = httpx.post(f"{live_server_url}/a2a/{target.agent_id}", json=sent,
                              headers={**caller.auth, "A2A-Version": "1.0"})
        assert response.status_code == 200 and "result" in response.json(), response.text
    first, second = [orjson.loads(r.body)["params"]["configuration"][
        "taskPushNotificationConfig"] for r in agent.requests if r.rpc_method == "SendMessage"]
    assert first == {"url": webhook.url("x"), "token": "caller-token"}
    assert first != second and second["url"].startswith(f"{live_server_url}/push/")


def test_push_relay_is_an_agent_field_of_the_api(echo_agent_factory, register_agent, api):
    """``push_relay``: true, false or null (the node's setting) on registration and PATCH;
    anything else is refused."""
    target = register_agent(echo_agent_factory(card_shape="1.0"), push_relay=False)
    assert target.registration["push_relay"] is False
    path = f"/api/v1/agents/{target.agent_id}"
    assert api.patch(path, json={"push_relay": True}).json()["push_relay"] is True
    assert api.patch(path, json={"ttl_seconds": 60}).json()["push_relay"] is True  # kept
    assert api.patch(path, json={"push_relay": None}).json()["push_relay"] is None
    refused = api.patch(path, json={"push_relay": "yes"})
    assert refused.status_code == 400 and "push_relay" in refused.text
    assert api.get(path).json()["push_relay"] is None


@pytest.mark.parametrize("shape", ["1.0", "0.3"])
async def test_config_answers_show_the_caller_its_own_webhook(
        echo_agent_factory, register_agent, caller, webhook, live_server_url, shape):
    """Create, get and list answers (the agent's, naming the relay) reach the caller with its
    own URL and token; pushes of a config set on a running task arrive too."""
    agent = echo_agent_factory(card_shape=shape, push=True, steps=2, step_delay=0.05)
    target = register_agent(agent)
    name = f"set-{os.urandom(3).hex()}"
    async with sdk_client(target.gateway_base, streaming=False, polling=True,
                          headers=caller.auth) as client:
        [first] = [e async for e in client.send_message(user_message("wait for pushes"))]
        task_id = first.task.id
        made = await client.create_task_push_notification_config(TaskPushNotificationConfig(
            task_id=task_id, id="mine", url=webhook.url(name), token="caller-token"))
        got = await client.get_task_push_notification_config(
            GetTaskPushNotificationConfigRequest(task_id=task_id, id="mine"))
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task_id))
        await client.cancel_task(CancelTaskRequest(id=task_id))
    for answer in (made, got, *listed.configs):
        assert (answer.url, answer.token) == (webhook.url(name), "caller-token"), answer
    stored = await db(lambda: RelayedConfig.objects.get(agent_id=target.agent_id))
    assert stored.task_id == task_id
    # The agent holds the relay's URL; the cancellation was pushed to the caller through it.
    got = wait_for(lambda: webhook.delivered(name), what="the cancellation's push")
    assert verified_claims(live_server_url, got[0])["task_id"] == task_id
