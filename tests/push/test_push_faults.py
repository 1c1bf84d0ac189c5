"""Push relay under faults, on a private PostgreSQL and Redis (tests/faults.py): a stream of
pushes through a real node (``manage.py serve``) to a loopback webhook, delivered by a real
``celery worker`` process, while (a) the node that takes the pushes is killed -9 and
restarted, (b) the worker is killed -9 while a delivery is in flight and restarted, (c) Redis
(the broker) is killed and restarted.

The config is relayed for real: a caller's 0.3 ``message/send`` with a
``pushNotificationConfig`` goes through the node to an a2a-sdk agent, which receives the
relay's URL and secret. The pushes are then sent by this test as a raw HTTP pusher presenting
that secret in ``X-A2A-Notification-Token`` (as the SDK's sender does): unlike the SDK's
sender, it knows exactly which pushes the node acknowledged (202) and which failed while the
node was down.

Asserted in each: every acknowledged push reaches the webhook; deduplicated by
``Idempotency-Key`` the first arrivals are in sequence order with no gap (pushes stored but
not acknowledged, because the node died before answering, are delivered too); duplicates are
at most one per deliverer death (the at-least-once window: one push in flight per config).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

import httpx
import orjson
import pytest

from tests import faults
from tests.a2a_agents import EchoAgent
from tests.push.test_celery import Worker
from tests.push.webhooks import Webhook, verified_claims, wait_for
from tests.reliability.conftest import register, services  # noqa: F401 - fixture

pytestmark = [pytest.mark.one_pass("distributed"), pytest.mark.timeout(180)]

PUSH_ENV = {
    "A2A_PUSH_RELAY": "true",
    "A2A_PUSH_DELIVERY": "celery",
    "A2A_PUSH_SWEEP_SECONDS": "0.5",
    "A2A_PUSH_BACKOFF_SECONDS": "0.05",
    "A2A_PUSH_BACKOFF_MAX_SECONDS": "0.5",
    "A2A_PUSH_TIMEOUT_SECONDS": "2",
    "A2A_PUSH_CLAIM_MARGIN_SECONDS": "3",
    "A2A_PUSH_MAX_ATTEMPTS": "50",
    "A2A_PUSH_RATE_PER_SECOND": "1000",
    "A2A_PUSH_RATE_BURST": "1000",
}


class SlowWebhook(Webhook):
    """The tests' webhook, taking each push at once but answering ``delay`` seconds later (a
    receiver that processed a push whose answer its sender may never read); ``in_flight``
    answers held."""

    delay = 0.0
    in_flight = 0

    async def _hook(self, request):
        answer = await super()._hook(request)
        self.in_flight += 1
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        return answer


@pytest.fixture(scope="module")
def rig(services):  # noqa: F811 - the fixture imported above
    env = dict(services["env"], **PUSH_ENV)
    tokens = faults.create_clients(env, {"admin": ["admin"], "caller": ["call"]})
    node = faults.Node(env)
    worker = Worker(env)
    hook = SlowWebhook().start()
    try:
        node.start()
        worker.start()
        with EchoAgent() as agent:
            agent_id = register(node.url, tokens["admin"], agent.url)
            yield {"env": env, "node": node, "worker": worker, "hook": hook, "agent": agent,
                   "agent_id": agent_id, "tokens": tokens, "services": services}
    finally:
        worker.terminate(timeout=5)
        node.terminate(timeout=5)
        hook.stop()


def _relayed(rig: dict, name: str) -> dict:
    """A config relayed by the node for the caller's webhook ``name``: what the agent got."""
    message_id = os.urandom(4).hex()
    response = httpx.post(
        f"{rig['node'].url}/a2a/{rig['agent_id']}", timeout=15,
        headers={"Authorization": f"Bearer {rig['tokens']['caller']}"},
        json={"jsonrpc": "2.0", "id": message_id, "method": "message/send", "params": {
            "message": {"role": "user", "messageId": message_id,
                        "parts": [{"kind": "text", "text": "hi"}]},
            "configuration": {"pushNotificationConfig": {
                "url": rig["hook"].url(name), "token": "caller-token"}}}})
    assert response.status_code == 200 and "result" in response.json(), response.text
    [sent] = [r for r in rig["agent"].requests if r.rpc_method == "message/send"
              and orjson.loads(r.body)["id"] == message_id]
    config = orjson.loads(sent.body)["params"]["configuration"]["pushNotificationConfig"]
    assert config["url"].startswith(f"{rig['node'].url}/push/")
    assert config["token"] != "caller-token"
    return config


class Pusher:
    """An agent's pushes of one task, one after another every ``pause`` seconds, in a thread:
    ``acked`` maps each acknowledged push's number to its sequence; ``refused`` counts the
    pushes that were not (connection refused or reset while the node was down)."""

    def __init__(self, config: dict, *, pause: float = 0.03) -> None:
        self.config, self.pause = config, pause
        self.task_id = f"task-{os.urandom(4).hex()}"
        self.acked: dict[int, int] = {}
        self.refused = 0
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Pusher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def wait_acked(self, count: int, timeout: float = 30) -> None:
        wait_for(lambda: len(self.acked) >= count, timeout, f"{count} acknowledged pushes")

    def _run(self) -> None:
        headers = {"X-A2A-Notification-Token": self.config["token"]}
        with httpx.Client(timeout=5) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                body = {"statusUpdate": {"taskId": self.task_id, "n": n,
                                         "status": {"state": "TASK_STATE_WORKING"}}}
                self.sent = n
                try:
                    response = client.post(self.config["url"], json=body, headers=headers)
                    if response.status_code == 202:
                        self.acked[n] = response.json()["sequence"]
                    else:
                        self.refused += 1
                except httpx.HTTPError:
                    self.refused += 1
                time.sleep(self.pause)


def _check(rig: dict, name: str, pusher: Pusher, *, deaths: int, timeout: float) -> dict:
    """Every acknowledged push delivered, in order with no gap, duplicates at most ``deaths``."""
    hook: Webhook = rig["hook"]
    relay_id = pusher.config["url"].rsplit("/", 1)[1]
    wanted = {f"{relay_id}.{seq}" for seq in pusher.acked.values()}

    def arrived() -> list:
        return [r.headers["idempotency-key"] for r in hook.delivered(name)]

    try:
        wait_for(lambda: wanted <= set(arrived()), timeout, "every acknowledged push")
    except AssertionError:
        raise AssertionError(f"missing {sorted(wanted - set(arrived()))[:10]}; worker log:\n"
                             f"{rig['worker'].log()}\nnode log:\n{rig['node'].log()}") from None
    keys = arrived()
    first: list[int] = []
    for key in keys:
        seq = int(key.rsplit(".", 1)[1])
        if seq not in first:
            first.append(seq)
    assert first == list(range(1, len(first) + 1)), first  # in order, no gap
    duplicates = len(keys) - len(first)
    assert duplicates <= deaths, (duplicates, keys)
    by_seq = {int(r.headers["idempotency-key"].rsplit(".", 1)[1]): r
              for r in hook.delivered(name)}
    for n, seq in pusher.acked.items():  # each acknowledged push is the push that was sent
        assert orjson.loads(by_seq[seq].body)["statusUpdate"]["n"] == n
        assert by_seq[seq].headers["x-a2a-task-id"] == pusher.task_id
    assert verified_claims(rig["node"].url, by_seq[1])["task_id"] == pusher.task_id
    return {"acked": len(pusher.acked), "delivered": len(first), "duplicates": duplicates,
            "refused": pusher.refused}


def test_node_killed_and_restarted_under_a_push_stream(rig):
    name = f"node-{os.urandom(3).hex()}"
    pusher = Pusher(_relayed(rig, name)).start()
    try:
        pusher.wait_acked(20)
        rig["node"].kill()
        time.sleep(0.3)  # pushes refused while it is down
        rig["node"].start()
        acked = len(pusher.acked)
        pusher.wait_acked(acked + 20)
    finally:
        pusher.stop()
    outcome = _check(rig, name, pusher, deaths=0, timeout=30)  # the node delivers nothing
    print("node killed:", outcome)
    assert outcome["refused"] >= 1, outcome  # the kill was felt by the pusher


def test_worker_killed_mid_delivery_and_restarted(rig):
    """The worker dies while the webhook, having taken a push, holds its answer: that push is
    tried again once its claim lapses (``A2A_PUSH_TIMEOUT_SECONDS`` +
    ``A2A_PUSH_CLAIM_MARGIN_SECONDS``): the one duplicate the at-least-once window allows."""
    name = f"worker-{os.urandom(3).hex()}"
    hook: SlowWebhook = rig["hook"]
    hook.delay = 0.2
    pusher = Pusher(_relayed(rig, name), pause=0.05).start()
    try:
        wait_for(lambda: len(hook.delivered(name)) >= 5, 30, "deliveries before the kill")
        wait_for(lambda: hook.in_flight > 0, 10, "an attempt in flight")
        rig["worker"].kill()
        rig["worker"].start()
        pusher.wait_acked(len(pusher.acked) + 20)
    finally:
        pusher.stop()
        hook.delay = 0.0
    outcome = _check(rig, name, pusher, deaths=1, timeout=60)
    print("worker killed:", outcome)


def test_redis_restarted_under_a_push_stream(rig):
    """The broker's queued delivery tasks are lost with it (no persistence): the nodes' sweep
    sends what is due again once Redis is back."""
    name = f"redis-{os.urandom(3).hex()}"
    redis: faults.PrivateRedis = rig["services"]["redis"]
    pusher = Pusher(_relayed(rig, name)).start()
    try:
        pusher.wait_acked(20)
        redis.kill()
        down = len(pusher.acked)
        pusher.wait_acked(down + 10)  # the ingress needs only PostgreSQL
        redis.start()
        pusher.wait_acked(len(pusher.acked) + 20)
    finally:
        pusher.stop()
    outcome = _check(rig, name, pusher, deaths=0, timeout=45)
    print("redis restarted:", outcome)
    assert outcome["refused"] == 0, outcome
