"""Hostile agents and hostile callers of the push relay.

Agents: a flood of pushes is cut at the agent's rate, an oversized push, a wrong secret, a
push to another config or for another task are refused with a JSON 4xx and store nothing.
Callers: a webhook that never answers and one that answers a byte at a time cost each attempt
at most ``A2A_PUSH_TIMEOUT_SECONDS``; the pushes are retried, then dead."""

from __future__ import annotations

import os
import re
import time

import httpx
import orjson
import pytest

from push.models import PushDelivery
from tests.push.webhooks import wait_for


def _task_push(task_id: str, state: str = "TASK_STATE_WORKING", pad: str = "") -> dict:
    return {"statusUpdate": {"taskId": task_id, "contextId": "c",
                             "status": {"state": state}, "metadata": {"pad": pad}}}


def relayed_config(live_server_url, register_agent, echo_agent_factory, caller, url: str,
                   task_id: str = "") -> tuple[str, str, str]:
    """A config the relay keeps for a real call: (agent id, the relay URL, its secret), as the
    agent got them."""
    agent = echo_agent_factory(card_shape="1.0")
    target = register_agent(agent)
    params: dict = {"url": url, "token": "caller-token"}
    if task_id:
        params["taskId"] = task_id
    message = {"role": "ROLE_USER", "messageId": os.urandom(4).hex(), "parts": [{"text": "hi"}]}
    sent = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": message,
                       "configuration": {"taskPushNotificationConfig": params}}}
    response = httpx.post(f"{live_server_url}/a2a/{target.agent_id}", json=sent,
                          headers={**caller.auth, "A2A-Version": "1.0"})
    assert response.status_code == 200, response.text
    [arrived] = [r for r in agent.requests if r.rpc_method == "SendMessage"]
    config = orjson.loads(arrived.body)["params"]["configuration"]["taskPushNotificationConfig"]
    return target.agent_id, config["url"], config["token"]


@pytest.fixture
def relayed(live_server_url, register_agent, echo_agent_factory, caller, webhook):
    return relayed_config(live_server_url, register_agent, echo_agent_factory, caller,
                          webhook.url(f"h-{os.urandom(3).hex()}"))


def _push(url: str, secret: str | None, body: bytes | dict) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers["X-A2A-Notification-Token"] = secret
    return httpx.post(url, content=content, headers=headers)


def _stored(agent_id: str) -> int:
    return PushDelivery.objects.filter(agent_id=agent_id).count()


def _refused_metric(base: str, reason: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    match = re.search(rf'^kubemq_a2a_push_refused_total{{reason="{reason}"}} (\S+)$', text, re.M)
    assert match, text[-2000:]
    return float(match.group(1))


def test_a_flood_of_pushes_is_cut_at_the_agents_rate(relayed, settings, live_server_url):
    settings.A2A_PUSH_RATE_PER_SECOND = 0.01  # no token comes back during the flood
    settings.A2A_PUSH_RATE_BURST = 5
    agent_id, url, secret = relayed
    before = _refused_metric(live_server_url, "rate")
    answers = [_push(url, secret, _task_push("t-flood")) for _ in range(20)]
    assert [a.status_code for a in answers[:5]] == [202] * 5
    refused = answers[5:]
    assert {a.status_code for a in refused} == {429}
    assert all(int(a.headers["retry-after"]) >= 1 for a in refused)
    assert "rate" in refused[0].json()["error"]
    assert _stored(agent_id) == 5
    assert _refused_metric(live_server_url, "rate") == before + 15


def test_an_oversized_push_is_refused_and_not_stored(relayed, settings):
    settings.A2A_PUSH_MAX_BYTES = 4096
    agent_id, url, secret = relayed
    response = _push(url, secret, _task_push("t-big", pad="x" * 8000))
    assert response.status_code == 413 and "4096 bytes" in response.json()["error"]
    assert _push(url, secret, _task_push("t-big")).status_code == 202  # a small one passes
    assert _stored(agent_id) == 1


def test_wrong_secrets_other_configs_and_other_tasks_are_refused(
        relayed, live_server_url, register_agent, echo_agent_factory, caller, webhook):
    agent_id, url, secret = relayed
    other_id, other_url, other_secret = relayed_config(
        live_server_url, register_agent, echo_agent_factory, caller, webhook.url("other"))
    body = _task_push("t-mine")
    for answer in (_push(url, None, body), _push(url, "not-the-secret", body),
                   _push(url, other_secret, body),  # another agent's secret for this config
                   _push(other_url, secret, body),  # this agent's secret for another config
                   _push(f"{live_server_url}/push/{'0' * 32}", secret, body)):
        assert answer.status_code == 401, answer.text
        assert answer.json() == {"error": "unknown push config or wrong "
                                          "X-A2A-Notification-Token"}
    for bad in (b"not json", b"[1]", orjson.dumps({"statusUpdate": {"status": {}}})):
        answer = _push(url, secret, bad)
        assert answer.status_code == 400 and "error" in answer.json()
    assert _stored(agent_id) == _stored(other_id) == 0
    assert _push(url, secret, body).status_code == 202  # the config's task is now t-mine
    answer = _push(url, secret, _task_push("t-someone-elses"))
    assert answer.status_code == 403 and "t-someone-elses" in answer.json()["error"]
    assert httpx.get(url).status_code == 405
    assert list(PushDelivery.objects.filter(agent_id=agent_id).values_list(
        "task_id", flat=True)) == ["t-mine"]


def test_a_config_set_for_a_task_takes_pushes_of_that_task_only(
        live_server_url, register_agent, echo_agent_factory, caller, webhook):
    agent_id, url, secret = relayed_config(live_server_url, register_agent, echo_agent_factory,
                                           caller, webhook.url("bound"), task_id="t-bound")
    assert _push(url, secret, _task_push("t-other")).status_code == 403
    assert _push(url, secret, _task_push("t-bound")).status_code == 202
    assert _stored(agent_id) == 1


@pytest.mark.parametrize("which", ["hang", "drip"])
def test_a_webhook_that_never_answers_or_drips_is_bounded_then_dead(
        which, live_server_url, register_agent, echo_agent_factory, caller, webhook, settings):
    settings.A2A_PUSH_MAX_ATTEMPTS = 2
    settings.A2A_PUSH_TIMEOUT_SECONDS = 0.5
    url = webhook.hang_url if which == "hang" else webhook.drip_url
    arrivals = webhook.hung if which == "hang" else webhook.dripped
    before = len(arrivals)
    agent_id, relay_url, secret = relayed_config(live_server_url, register_agent,
                                                 echo_agent_factory, caller, url)
    started = time.monotonic()
    assert _push(relay_url, secret, _task_push("t-slow")).status_code == 202

    def dead():
        row = PushDelivery.objects.filter(agent_id=agent_id).first()
        return row is not None and row.state == "dead" and row

    row = wait_for(dead, timeout=10, what="the push dead")
    # Two attempts of at most 0.5 s each, a short backoff and the sweeps between them.
    assert time.monotonic() - started < 6.0
    assert (row.attempts, row.last_error, row.last_status) == (2, "no answer within 0.5s",
                                                               None)
    assert len(arrivals) - before == 2
