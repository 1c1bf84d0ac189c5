"""Push-notification webhooks in a request are checked like agent URLs before the agent sees
the request: a refused one is answered ``webhook_refused`` (executed false) and never reaches
the agent; an acceptable one is forwarded unchanged with the push relay off (relayed:
tests/push/). A 1.0 and a 0.3 shape of each method."""

from __future__ import annotations

import orjson
import pytest

from tests.gateway import test_proxy as proxy
from tests.gateway.test_proxy import error_of, new_id, register, rpc

agent, gw, token = proxy.agent, proxy.gw, proxy.token

REFUSED = [
    ("http://169.254.169.254/latest/meta-data/", "metadata"),
    ("http://169.254.10.1/", "link-local"),
    ("http://metadata.google.internal/computeMetadata/v1/", "metadata"),
    ("file:///etc/passwd", "http or https"),
    ("http://admin:secret@hooks.example.com/cb", "credentials"),
    ("http://0.0.0.0:8000/admin", "refused"),
]


def _requests(url: str) -> list[tuple[str, dict]]:
    """Every method that carries a webhook, with ``url`` where that method carries it."""
    message = {"role": "user", "messageId": "m1", "parts": [{"kind": "text", "text": "hi"}]}
    return [
        ("message/send", {"message": message,
                          "configuration": {"pushNotificationConfig": {"url": url}}}),
        ("message/stream", {"message": message,
                            "configuration": {"pushNotificationConfig": {"url": url}}}),
        ("tasks/pushNotificationConfig/set", {"taskId": "t1",
                                              "pushNotificationConfig": {"url": url}}),
        ("SendMessage", {"message": message,
                         "configuration": {"taskPushNotificationConfig": {"url": url}}}),
        ("SendStreamingMessage", {"message": message,
                                  "configuration": {"taskPushNotificationConfig": {"url": url}}}),
        ("CreateTaskPushNotificationConfig", {"taskId": "t1", "url": url}),
    ]


@pytest.mark.parametrize("url,reason", REFUSED)
def test_a_refused_webhook_never_reaches_the_agent(gw, agent, url, reason):
    agent_id = new_id("hook")
    register(agent_id, agent.url)
    for method, params in _requests(url):
        response = gw.post(f"/a2a/{agent_id}", json={"jsonrpc": "2.0", "id": 7,
                                                     "method": method, "params": params})
        error = error_of(response)
        assert error["code"] == -32069, (method, error)
        assert reason in error["message"], (method, error["message"])
        assert error["data"]["kind"] == "webhook_refused"
        assert error["data"]["executed"] is False
        assert response.headers["x-a2a-executed"] == "false"
    assert agent.arrived == []


def test_an_acceptable_webhook_is_forwarded_unchanged(gw, agent, settings):
    """With the push relay off (embedded mode's default; relayed: tests/push/)."""
    settings.A2A_PUSH_RELAY = False
    agent_id = new_id("hook")
    register(agent_id, agent.url)
    sent = rpc("message/send", text="hi",
               configuration={"pushNotificationConfig": {"url": "http://127.0.0.1:9/hook",
                                                         "token": "caller-secret"}})
    response = gw.post(f"/a2a/{agent_id}", json=sent)
    assert response.status_code == 200 and "result" in response.json(), response.text
    assert len(agent.arrived) == 1
    assert orjson.loads(agent.arrived[0].body)["params"]["configuration"] == \
        sent["params"]["configuration"]


def test_a_large_body_is_checked_too(gw, agent):
    """Above the lazy-parse threshold the body is parsed whole for the check."""
    agent_id = new_id("hook")
    register(agent_id, agent.url)
    big = rpc("message/send", pad="x" * 40_000,
              configuration={"pushNotificationConfig": {"url": "http://169.254.169.254/"}})
    error = error_of(gw.post(f"/a2a/{agent_id}", json=big))
    assert error["data"]["kind"] == "webhook_refused"
    assert agent.arrived == []


def test_a_webhook_that_is_not_a_string_is_refused(gw, agent):
    agent_id = new_id("hook")
    register(agent_id, agent.url)
    bad = rpc("tasks/pushNotificationConfig/set", taskId="t1",
              pushNotificationConfig={"url": {"nested": True}})
    error = error_of(gw.post(f"/a2a/{agent_id}", json=bad))
    assert error["data"]["kind"] == "webhook_refused"
    assert "non-empty string" in error["message"]
    assert agent.arrived == []


def _spelled_otherwise(url: str) -> list[tuple[str, bytes]]:
    """Requests whose config key is spelled as the SDKs also parse it: the proto field name
    (protobuf's ``ParseDict`` and ``Parse`` take it, as pydantic's ``populate_by_name`` does)
    and a JSON ``\\u`` escape; small and above the lazy-parse threshold."""
    message = {"role": "user", "messageId": "m1", "parts": [{"kind": "text", "text": "hi"}]}
    snake_v1 = {"message": message,
                "configuration": {"task_push_notification_config": {"url": url}}}
    snake_v03 = {"message": message, "configuration": {"push_notification_config": {"url": url}}}
    bodies = [("SendMessage", orjson.dumps(rpc("SendMessage", **snake_v1))),
              ("message/send", orjson.dumps(rpc("message/send", **snake_v03))),
              ("tasks/pushNotificationConfig/set", orjson.dumps(rpc(
                  "tasks/pushNotificationConfig/set", taskId="t1",
                  push_notification_config={"url": url}))),
              ("SendMessage", orjson.dumps(rpc("SendMessage", pad="x" * 40_000, **snake_v1)))]
    escaped = []
    for pad in ("", "x" * 40_000):  # small, and above the lazy-parse threshold
        body = orjson.dumps(rpc("message/send", pad=pad, **{
            "message": message, "configuration": {"pushNotificationConfig": {"url": url}}}))
        # The "o" escaped: the body no longer holds the key's letters as they are.
        body = body.replace(b'"pushNotificationConfig"', b'"pushN\\u006ftificationConfig"')
        assert b"otification" not in body
        escaped.append(("message/send", body))
    return [*bodies, *escaped]


def test_a_config_key_spelled_otherwise_is_checked_too(gw, agent):
    agent_id = new_id("hook")
    register(agent_id, agent.url)
    for method, body in _spelled_otherwise("http://169.254.169.254/latest/meta-data/"):
        response = gw.post(f"/a2a/{agent_id}", content=body,
                           headers={"content-type": "application/json"})
        error = error_of(response)
        assert error["data"]["kind"] == "webhook_refused", (method, body[:200], error)
    assert agent.arrived == []
