"""The one way every admitted call takes to the agent's subscriber, whatever its binding
(JSON-RPC, HTTP+JSON, the gRPC listener's, KubeMQ's server-push stream): :func:`forward_call`
names it in the envelope's tags, counts and traces it, hands its Query to the subscriber -- a
stream relay, the local fast path inline, or a Query through the broker
(:mod:`gateway.relays`) -- and records its outcome."""

from __future__ import annotations

import asyncio
import enum
import time
from typing import TYPE_CHECKING, Any

from core import lifecycle as node_config
from gateway import envelope as env
from gateway import errors, metrics, recorder, tracing
from gateway.bodies import Receive, Send
from gateway.exchange import Exchange
from gateway.headers import RequestHeaders
from gateway.relays import new_request_id, relay_stream, remote_sync
from registry.events import AgentRoute

if TYPE_CHECKING:
    from gateway.binding import BindingCaller
    from gateway.runtime import GatewayNode
    from gateway.subscriber import VirtualSubscriber


class _Nowhere(enum.Enum):
    NOWHERE = 0


#: A route no subscriber can answer: owned here without a live subscriber, or owned by another
#: node while the channel layer reaches only this process.
NOWHERE = _Nowhere.NOWHERE


def subscriber_of(node: GatewayNode, route: AgentRoute) -> VirtualSubscriber | _Nowhere | None:
    """The route's subscriber in this process; None when another node owns it (reached
    through the broker); :data:`NOWHERE` when no subscriber can answer."""
    if route.node_id == node.settings.NODE_ID:
        return node.manager.subscribers.get(route.agent_id) or NOWHERE
    if not node.cross_process or route.node_id in node.dead_nodes:
        return NOWHERE  # the owner is down: nothing is sent (its agents are being adopted)
    return None


async def forward_call(node: GatewayNode, route: AgentRoute, send: Send, receive: Receive,
                       rpc_id: Any, caller: str, tags: dict[str, str], method: str, body: bytes,
                       timeout: float, *, streaming: bool, started: float,
                       payload: dict[str, Any] | None, binding: str = "JSONRPC",
                       profile: str = "a2a", extra_tags: dict[str, str] | None = None,
                       request_bytes: int | None = None,
                       record_cancelled: bool = False) -> Exchange:
    """Forward an admitted call (``body``: what the agent gets; ``tags``: the caller's, from
    its headers) and answer its caller from the subscriber's replies, through an
    :class:`~gateway.exchange.Exchange` of ``rpc_id`` (a JSON-RPC id, REST, or a
    :class:`~gateway.binding.BindingCaller`) and the error ``profile``.

    Metrics, the console's audit (``request_bytes``: the size recorded, else the body's) and
    tracing (``payload``: what the entry span reads the task and context ids from). A call
    cancelled by the server answers ``node_stopping`` when the node is stopping; one cancelled
    otherwise is recorded (as ``client_disconnect``) only with ``record_cancelled``."""
    settings = node.settings
    agent_id = route.agent_id
    size = len(body) if request_bytes is None else request_bytes
    metrics.count_request(agent_id, method)
    tags[env.TAG_METHOD] = method
    tags[env.TAG_TIMEOUT] = repr(timeout)
    tags[env.TAG_CALLER] = caller
    tags[env.TAG_REQUEST_ID] = new_request_id()
    if extra_tags:
        tags.update(extra_tags)
    trace = None
    if tracing.ENABLED:
        trace = tracing.start_call(send, agent_id=agent_id, method=method, payload=payload,
                                   request_bytes=size, tags=tags, caller=caller,
                                   node_id=settings.NODE_ID, binding=binding)
        send = trace.send
    exchange = Exchange(send, rpc_id, agent_id, profile)
    query = env.query(body, tags)
    subscriber = subscriber_of(node, route)
    try:
        try:
            if subscriber is NOWHERE:
                await exchange.fail(errors.UNREACHABLE, "no live subscriber for this agent")
            elif streaming:
                await relay_stream(node, subscriber, query, exchange, receive, route.node_id)
            elif subscriber is not None and settings.A2A_LOCAL_FAST_PATH:
                # The local fast path, inline: the subscriber's own outbound timeout (the
                # caller's, shorter than the gateway's wait) always ends the call first, so
                # no second timer.
                call = subscriber.local_call(query, exchange.deliver)
                if call is not None:
                    await call
                else:
                    await subscriber.handle(query, exchange.deliver, local=True)
                if not exchange.done:
                    await exchange.fail(errors.UNREACHABLE, "the subscriber gave no answer")
            else:
                await remote_sync(node, query, exchange,
                                  timeout + settings.A2A_GATEWAY_TIMEOUT_BUFFER_SECONDS,
                                  route.node_id)
        except asyncio.CancelledError:
            if not await answer_stopping(exchange):
                raise
    except BaseException as exc:
        if record_cancelled:
            if isinstance(exc, asyncio.CancelledError) and not exchange.done:
                exchange.outcome = "client_disconnect"
            _record(agent_id, caller, method, exchange, size, started, trace)
        raise
    _record(agent_id, caller, method, exchange, size, started, trace)
    return exchange


def _record(agent_id: str, caller: str, method: str, exchange: Exchange, size: int,
            started: float, trace: tracing.CallTrace | None) -> None:
    seconds = time.perf_counter() - started
    metrics.observe_latency(agent_id, exchange.outcome, seconds)
    recorder.record(agent_id, caller, method, exchange, size, seconds)
    if trace is not None:
        trace.end(exchange.outcome)


async def forward_binding_call(node: GatewayNode, route: AgentRoute, client_id: str, send: Send,
                               receive: Receive, caller: BindingCaller, headers: RequestHeaders,
                               method: str, body: bytes, timeout: float, *, streaming: bool,
                               binding: str, started: float,
                               payload: dict[str, Any] | None = None) -> Exchange:
    """Forward an admitted call (``body``: the JSON-RPC request the agent gets, ``method``:
    its method) the one way every call takes (:func:`forward_call`): the agent's answer reaches
    ``send`` as ASGI messages, the gateway's errors ``caller``. Metrics, the console's audit
    and tracing as for a JSON-RPC call; a call cancelled by its caller is recorded too."""
    return await forward_call(node, route, send, receive, caller, client_id, headers.tags,
                              method, body, timeout, streaming=streaming, started=started,
                              payload=payload, binding=binding, record_cancelled=True)


async def answer_stopping(exchange: Exchange) -> bool:
    """A call cancelled by its server: when the node is stopping (its drain ended before the
    call did), answer ``node_stopping`` -- a JSON-RPC error, or a terminal ``event: error`` in
    a stream -- instead of a cut connection or a bare 500, and say the cancellation is handled
    (the server ends the request either way). Executed true: the call had been forwarded."""
    if not node_config.draining():
        return False
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
    try:
        async with asyncio.timeout(1.0):  # a caller that stopped reading cannot hold the stop
            await exchange.fail(errors.NODE_STOPPING,
                                "the node stopped before the call ended; retry on another node",
                                executed=True)
    except (TimeoutError, OSError):
        pass
    return True

