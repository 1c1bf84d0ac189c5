"""``POST /push/<relay id>``: the agents' pushes, taken durably before they are acknowledged;
and ``GET /.well-known/jwks.json``, the keys that verify the platform's signature.

A push is checked in this order, each refusal a JSON ``{"error": ...}`` and nothing stored:
405 (not POST), 413 (above ``A2A_PUSH_MAX_BYTES``, announced or read), 401 (an unknown relay id
or a wrong ``X-A2A-Notification-Token``: one answer for both, so the relay ids cannot be
probed), 429 (above the agent's rate, ``A2A_PUSH_RATE_PER_SECOND``/``A2A_PUSH_RATE_BURST``, per
node; ``Retry-After``), 400 (not a JSON object, or no task id in it), 403 (a task the config is
not for), 403 (the agent the config was relayed for is no longer in that tenant: moved to
another tenant, or deregistered, even if an agent of the same id has registered there since;
its callers' webhooks are not its to push to). Then
the push is written (its per-config sequence, its idempotency key) and only
after the commit answered 202; its delivery is started once committed (:mod:`push.worker`).
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import transaction
from django.db.models import F
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from push import metrics, relay, worker
from push.models import PushDelivery, RelayedConfig
from push.signing import jwks
from registry import selectors

logger = logging.getLogger(__name__)

TOKEN_HEADER = "X-A2A-Notification-Token"
#: Agents whose rate this process tracks at most (the least recently seen dropped beyond).
RATE_AGENTS = 10_000


def _error(status: int, message: str, reason: str = "", **headers: str) -> JsonResponse:
    if reason:
        metrics.count(f"refused:{reason}")
    response = JsonResponse({"error": message}, status=status)
    for name, value in headers.items():
        response[name] = value
    return response


class AgentRates:
    """A token bucket per agent (``rate`` per second, ``burst`` at most), bounded in size."""

    def __init__(self) -> None:
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, agent_id: str, rate: float, burst: int) -> float:
        """0 when a push of ``agent_id`` may go now (a token taken), else the seconds until
        one may."""
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.pop(agent_id, (float(burst), now))
            tokens = min(float(burst), tokens + (now - last) * rate)
            wait = 0.0
            if tokens >= 1.0:
                tokens -= 1.0
            else:
                wait = (1.0 - tokens) / rate
            self._buckets[agent_id] = (tokens, now)
            while len(self._buckets) > RATE_AGENTS:
                self._buckets.popitem(last=False)
            return wait


rates = AgentRates()


def task_of(payload: dict[str, Any]) -> str | None:
    """The task id a push names: an A2A 1.0 ``StreamResponse`` (``task``, ``statusUpdate``,
    ``artifactUpdate``, ``message``) or an A2A 0.3 push (the task itself, or an event with a
    ``taskId``)."""
    for key, field in (("task", "id"), ("statusUpdate", "taskId"),
                       ("artifactUpdate", "taskId"), ("message", "taskId")):
        inner = payload.get(key)
        if isinstance(inner, dict):
            value = inner.get(field)
            return value if isinstance(value, str) and value else None
    value = payload.get("taskId")
    if value is None and payload.get("kind", "task") == "task":
        value = payload.get("id")
    return value if isinstance(value, str) and value else None


#: Task states after which an agent pushes nothing more (A2A 0.3 names; 1.0 ``TASK_STATE_*``).
DONE_STATES = frozenset({"completed", "failed", "canceled", "cancelled", "rejected"})


def task_done(payload: dict[str, Any]) -> bool:
    """Whether a push shows its task in a terminal state: a task's ``status.state`` or a status
    update's (A2A 1.0 ``task`` / ``statusUpdate``, A2A 0.3 the task or its event)."""
    for holder in (payload.get("task"), payload.get("statusUpdate"), payload):
        if not isinstance(holder, dict):
            continue
        status = holder.get("status")
        if isinstance(status, dict) and isinstance(status.get("state"), str):
            state = status["state"].lower().removeprefix("task_state_")
            return state in DONE_STATES
    return False


def _authenticated(relay_id: str, token: str | None) -> RelayedConfig | None:
    if token is None or len(relay_id) != relay.RELAY_ID_LENGTH or not relay_id.isalnum():
        return None
    config = RelayedConfig.objects.filter(pk=relay_id).first()
    if config is None:
        return None
    if not hmac.compare_digest(relay.secret_digest(token), config.secret_sha256):
        return None
    return config


def _agent_still_there(config: RelayedConfig) -> bool:
    """Whether the agent the config was relayed for is still registered in the config's tenant
    (one query). An agent moved to another tenant has another routing key and is not; nor is
    an agent of the same id registered since (after a deregistration, or after the first one
    moved away): its row is another. Configs kept before the row was recorded check the key."""
    found = selectors.agent_pk_by_key(key=config.agent_id)
    return found is not None and config.agent_pk in (None, found)


def _store(config: RelayedConfig, task_id: str, body: bytes, *,
           done: bool = False) -> PushDelivery | None:
    """Write the push (None: the config is bound to another task); ``done``: it shows the task
    finished (the config is purged after the retention, :func:`push.delivery.purge`)."""
    now = timezone.now()
    marks: dict[str, Any] = {"last_push_at": now}
    if done:
        marks["task_done_at"] = now
    with transaction.atomic():
        if not config.task_id:  # the first push names the config's task (a sent message's)
            RelayedConfig.objects.filter(pk=config.pk, task_id="").update(task_id=task_id)
        # The counter's row update locks the config: one sequence number per push, in order.
        RelayedConfig.objects.filter(pk=config.pk).update(sequence=F("sequence") + 1,
                                                          **marks)
        bound, sequence = RelayedConfig.objects.filter(pk=config.pk).values_list(
            "task_id", "sequence").get()
        if bound != task_id:
            transaction.set_rollback(True)
            return None
        delivery = PushDelivery.objects.create(
            config=config, tenant_id=config.tenant_id, agent_id=config.agent_id,
            task_id=task_id, sequence=sequence, body=body,
            idempotency_key=f"{config.pk}.{sequence}")
        # robust: a broker down must not fail an answer whose push is committed (the sweep
        # enqueues it later).
        transaction.on_commit(lambda: worker.enqueue(config.pk), robust=True)
    return delivery


@csrf_exempt
def push_view(request: HttpRequest, relay_id: str) -> HttpResponse:
    if request.method != "POST":
        return _error(405, f"method {request.method} not allowed: use POST", Allow="POST")
    cap = settings.A2A_PUSH_MAX_BYTES
    try:
        announced = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return _error(400, "Content-Length is not a number")
    if announced > cap:
        return _error(413, f"a push may be {cap} bytes at most", "size")
    try:
        body = request.body
    except RequestDataTooBig:
        return _error(413, f"a push may be {cap} bytes at most", "size")
    if len(body) > cap:
        return _error(413, f"a push may be {cap} bytes at most", "size")
    config = _authenticated(relay_id, request.headers.get(TOKEN_HEADER))
    if config is None:
        return _error(401, f"unknown push config or wrong {TOKEN_HEADER}", "auth")
    wait = rates.take(config.agent_id, settings.A2A_PUSH_RATE_PER_SECOND,
                      settings.A2A_PUSH_RATE_BURST)
    if wait:
        return _error(429, f"agent {config.agent_id} pushes above its rate; retry later",
                      "rate", **{"Retry-After": str(max(1, round(wait)))})
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return _error(400, "a push must be a JSON object", "invalid")
    if not isinstance(payload, dict):
        return _error(400, "a push must be a JSON object", "invalid")
    task_id = task_of(payload)
    if task_id is None or len(task_id) > 200:
        return _error(400, "the push names no task (task.id, statusUpdate.taskId, "
                           "artifactUpdate.taskId, message.taskId, or a 0.3 task's id)", "invalid")
    if config.task_id and config.task_id != task_id:
        return _error(403, f"this push config is not for task {task_id}", "task")
    if not _agent_still_there(config):
        return _error(403, f"agent {config.agent_id} is no longer registered in tenant "
                           f"{config.tenant_id}: its push configs there are void", "tenant")
    delivery = _store(config, task_id, body, done=task_done(payload))
    if delivery is None:
        return _error(403, f"this push config is not for task {task_id}", "task")
    metrics.count("received")
    return JsonResponse({"accepted": True, "task_id": task_id, "sequence": delivery.sequence},
                        status=202)


@csrf_exempt
def jwks_view(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return _error(405, f"method {request.method} not allowed: use GET", Allow="GET, HEAD")
    response = JsonResponse(jwks())
    response["Content-Type"] = "application/jwk-set+json"
    response["Cache-Control"] = "public, max-age=300"
    return response
