"""Callers' push-notification webhooks, checked before a call reaches the agent.

A caller hands an agent a webhook (a push-notification config) for a long task to report back
on. Forwarded unchecked, that URL makes the agent a request forger: the cloud metadata address,
a node's admin port, a private service the caller cannot reach but the agent can. So every
webhook a request carries is checked by the rules agent URLs get at registration
(``registry.netcheck.check_agent_url``: http(s) only, no credentials, no metadata hosts, the
allowlist when set, names resolved and their addresses checked), and a request carrying a
refused one is answered ``webhook_refused`` (executed false) without reaching the agent.

Where a webhook travels, per protocol version (the same shapes on every binding: the HTTP+JSON
and gRPC requests are the same messages):

========================================  =================================================
A2A 1.0 ``SendMessage``,                  ``params.configuration.taskPushNotificationConfig
``SendStreamingMessage``                  .url``
A2A 1.0 ``CreateTaskPushNotificationConfig``  ``params.url`` (the params are the config)
A2A 0.3 ``message/send``, ``message/stream``  ``params.configuration.pushNotificationConfig.url``
A2A 0.3 ``tasks/pushNotificationConfig/set``  ``params.pushNotificationConfig.url``
========================================  =================================================

The check runs only for these methods, and for bodies the gateway parses lazily (above 16 KiB)
only when the body names a push config at all, so other calls pay one set lookup.

In relay mode (``A2A_PUSH_RELAY``, an agent's ``push_relay`` overriding it; docs/push.md) every
accepted config is then kept by the gateway and rewritten in place (:func:`relay`, the one
implementation every binding calls through :func:`gateway.admission.refused_webhook`): the
agent gets the gateway's ``/push/<relay id>`` and a secret of its own instead of the caller's
URL, token and credentials.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from a2a.compat.v0_3 import a2a_v0_3_pb2 as pb03
from a2a.types import a2a_pb2
from django.db import close_old_connections
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.message import DecodeError, Message

from core import threads
from gateway.bodies import Send, WholeAnswer
from push import relay as push_relay
from registry.events import AgentRoute
from registry.netcheck import UnsafeUrl, check_agent_url

logger = logging.getLogger(__name__)

METHODS = push_relay.METHODS
#: Methods whose answers show configs: relayed ones shown back as the caller set them.
CONFIG_ANSWERS = push_relay.CONFIG_ANSWERS
#: What a body naming a push config holds, however its key is spelled (``...NotificationConfig``
#: or ``..._notification_config``). A JSON escape could spell one of its letters otherwise, and
#: an ASCII letter's escape is ``\u00XX``: a body with one is looked into too (:func:`may_carry`).
_MARKER = b"otification"
_BACKSLASH = b"\\"
_LETTER_ESCAPE = b"\\u00"


_SENDS = push_relay.IN_SEND_V1 | push_relay.IN_SEND_V03


def may_carry(method: str, body: bytes) -> bool:
    """Whether ``body`` of ``method`` may carry a push-notification config: False only when it
    cannot (then no config is looked for: a send's common case). A config method's body may be
    the config itself (HTTP+JSON), which names no key.

    Byte searches, costed on a 256 KiB body (CPython 3.11, this machine's kind): the marker
    ~90 us; a backslash ~4 us (``memchr``); ``\\u00`` ~160 us and ``\\u`` ~300 us (a short
    needle skips little). So the escape is looked for only in a body with a backslash at all:
    a send without one pays the marker and the ``memchr``, as before the escape check."""
    return (method not in _SENDS or _MARKER in body
            or (_BACKSLASH in body and _LETTER_ESCAPE in body))


#: Webhook checks (which may resolve a name) run on threads of their own, at most this many.
CHECK_THREADS = 4
#: Configs are written to the database by threads of their own, at most this many.
RELAY_THREADS = 4
NO_RELAY_BASE = ("push notification webhook refused: the push relay has no URL for agents to "
                 "reach this node from a gRPC call: set A2A_PUSH_RELAY_BASE_URL")
RELAY_DOWN = ("push notification webhook refused: the push relay cannot keep it now (its "
              "database is unavailable); retry")


def webhook_urls(method: str, params: Any) -> list[Any]:
    """The webhook URLs ``params`` of ``method`` carry (as sent: not necessarily strings)."""
    return [config["url"] for config in push_relay.configs(method, params)]


def refusal(urls: list[Any]) -> str | None:
    """Why one of ``urls`` is refused (the first), or None when all pass. Blocking (a name may
    be resolved): call it through :func:`check`."""
    for url in urls:
        try:
            check_agent_url(url)
        except UnsafeUrl as exc:
            return f"push notification webhook refused: {exc}"
    return None


async def check(method: str, params: Any, *, rest: bool = False) -> str | None:
    """:func:`refusal` of the webhooks ``params`` carry, off the event loop. ``rest``: the
    params are an HTTP+JSON body forwarded as it is (either version's shape)."""
    urls = [config["url"] for config in push_relay.configs(method, params, rest=rest)]
    if not urls:
        return None
    pool = threads.pool("a2a-webhook-check", CHECK_THREADS)
    return await asyncio.get_running_loop().run_in_executor(pool, refusal, urls)


def relays(route: AgentRoute, default: bool) -> bool:
    """Whether the webhooks of calls to ``route``'s agent are relayed."""
    return default if route.push_relay is None else route.push_relay


def carries(method: str, params: Any, *, rest: bool = False) -> bool:
    """Whether ``params`` of ``method`` carry a push-notification config."""
    return method in METHODS and bool(push_relay.configs(method, params, rest=rest))


def _keep(method: str, params: Any, agent_id: str, caller: str, base_url: str,
          rest: bool) -> int:
    close_old_connections()  # a connection the database dropped since is not reused
    try:
        return push_relay.relay(method, params, agent_id=agent_id, client_id=caller,
                                base_url=base_url, rest=rest)
    finally:
        close_old_connections()  # back to the pool: this thread may idle long


async def relay(method: str, params: Any, *, agent_id: str, caller: str, base_url: str,
                rest: bool = False) -> str | None:
    """Keep the configs of ``params`` and point them at the gateway (in place): None, or why
    they could not be (the call is then refused, executed false)."""
    if not base_url:
        return NO_RELAY_BASE
    pool = threads.pool("a2a-push-relay", RELAY_THREADS)
    try:
        await asyncio.get_running_loop().run_in_executor(
            pool, _keep, method, params, agent_id, caller, base_url, rest)
    except Exception as exc:  # the database: the caller retries
        logger.warning("push relay: cannot keep a config for %s: %s: %s", agent_id,
                       type(exc).__name__, exc)
        return RELAY_DOWN
    return None


class ConfigAnswer(WholeAnswer):
    """The caller's ``send`` for a push-config call (:data:`push.relay.CONFIG_ANSWERS`) on
    JSON-RPC or HTTP+JSON, forwarded or translated: the answer is held whole (small: configs)
    and every relayed config in it shown as the caller set it (its own URL, token and
    ``authentication``; only configs this caller set for this agent) before it reaches the
    caller. Errors and other statuses pass unchanged. A gRPC caller's call translated to the
    agent's JSON-RPC goes through it too; one passed through to the agent's gRPC server has its
    protobuf answer rewritten by :func:`grpc_answer_shown`."""

    __slots__ = ("agent_id", "caller")

    def __init__(self, send: Send, agent_id: str, caller: str) -> None:
        super().__init__(send)
        self.agent_id = agent_id
        self.caller = caller

    async def rewritten(self, body: bytes) -> bytes:
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body
        found = push_relay.relayed_in(answer)
        if not found:
            return body
        done = await show(found, self.agent_id, self.caller)
        return orjson.dumps(answer) if done else body


#: The protobuf answer of each push-config method passed through to an agent's gRPC server.
GRPC_ANSWERS: dict[tuple[str, str], type[Message]] = {
    ("1.0", "CreateTaskPushNotificationConfig"): a2a_pb2.TaskPushNotificationConfig,
    ("1.0", "GetTaskPushNotificationConfig"): a2a_pb2.TaskPushNotificationConfig,
    ("1.0", "ListTaskPushNotificationConfigs"): a2a_pb2.ListTaskPushNotificationConfigsResponse,
    ("0.3", "CreateTaskPushNotificationConfig"): pb03.TaskPushNotificationConfig,
    ("0.3", "GetTaskPushNotificationConfig"): pb03.TaskPushNotificationConfig,
    ("0.3", "ListTaskPushNotificationConfigs"): pb03.ListTaskPushNotificationConfigResponse,
}


async def grpc_answer_shown(reply: bytes, version: str, method: str, agent_id: str,
                            caller: str) -> bytes:
    """A push-config answer of an agent's own gRPC server (``method``: the core method, in
    ``version``), re-encoded with every relayed config in it shown as ``caller`` set it (as
    :class:`ConfigAnswer` does for JSON); unchanged when it names no relay URL of the caller's
    or cannot be decoded."""
    cls = GRPC_ANSWERS.get((version, method))
    if cls is None:
        return reply
    try:
        message = cls.FromString(reply)
    except DecodeError:
        return reply
    shape = MessageToDict(message)
    if not await shown(shape, version, agent_id, caller):
        return reply
    message.Clear()
    ParseDict(shape, message, ignore_unknown_fields=True)
    return bytes(message.SerializeToString())


async def shown(shape: Any, version: str, agent_id: str, caller: str) -> int:
    """Show, in place, every relayed config of ``caller`` in an answer's JSON form (of
    ``version``) as the caller set it; how many were."""
    found = push_relay.relayed_in(shape)
    if not found:
        return 0
    done = await show(found, agent_id, caller)
    for config in (c for configs in found.values() for c in configs) if done else ():
        if "authentication" in config:
            config["authentication"] = _authentication(config["authentication"], version)
    return done


def _authentication(stored: Any, version: str) -> Any:
    """A caller's stored ``authentication`` (either version's shape) in ``version``'s."""
    if not isinstance(stored, dict):
        return stored
    credentials = stored.get("credentials")
    if version == "0.3" and "scheme" in stored:
        return {"schemes": [stored["scheme"]], "credentials": credentials}
    schemes = stored.get("schemes")
    if version == "1.0" and "scheme" not in stored and isinstance(schemes, list) and schemes:
        return {"scheme": schemes[0], "credentials": credentials}
    return stored


async def show(found: dict[str, list[dict[str, Any]]], agent_id: str, caller: str) -> int:
    """:func:`push.relay.show_callers_own` off the event loop: how many configs were shown
    back. When the database fails every relayed config keeps the relay's URL and loses the
    relay's secret (:func:`push.relay.hide_secrets`; logged): no secret leaks meanwhile."""
    pool = threads.pool("a2a-push-relay", RELAY_THREADS)
    try:
        return await asyncio.get_running_loop().run_in_executor(
            pool, _show, found, agent_id, caller)
    except Exception as exc:
        logger.warning("push relay: cannot show %s its configs (their relay secrets are "
                       "withheld): %s", caller, exc)
        return push_relay.hide_secrets(found)


def _show(found: dict[str, list[dict[str, Any]]], agent_id: str, caller: str) -> int:
    close_old_connections()
    try:
        return push_relay.show_callers_own(found, agent_id=agent_id, client_id=caller)
    finally:
        close_old_connections()
