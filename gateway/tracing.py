"""The gateway's tracing glue (docs/tracing.md): one span per call on the node the caller
reached, a child span on the node whose subscriber calls the agent, W3C context all the way.

- Entry (``handler``): continues the caller's ``traceparent``/``tracestate`` (they arrive as the
  ``a2a_hdr_*`` tags), opens a SERVER span ``a2a <method>`` and writes its context into the
  Query envelope's trace tags (``envelope.TAG_TRACEPARENT``/``TAG_TRACESTATE``), which travel
  through the broker unchanged.
- Subscriber: opens a CLIENT span ``a2a.agent <method>`` as a child of the envelope's context
  (so across nodes the owning node's span is a child of the entry node's) and puts *its*
  context in the ``traceparent`` the agent receives.

Attributes: ``a2a.agent_id``, ``rpc.system``/``rpc.method``, ``a2a.task_id`` and
``a2a.context_id`` (request, and the agent's answer when it is small JSON), ``a2a.outcome`` (the
gateway's outcome kind), ``a2a.executed``, ``a2a.request_bytes``/``a2a.response_bytes``,
``a2a.node``, ``http.response.status_code``.

With tracing off (the default) the hot path pays one boolean check: callers test
:data:`ENABLED` before calling anything here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from gateway import envelope as env
from gateway.jsonrpc import is_error_reply

#: Read by the hot path before calling into this module; set by core.tracing.setup().
ENABLED = False
_tracer: Any = None
_propagator: Any = None
_kinds: Any = None

_HDR_TRACEPARENT = "a2a_hdr_traceparent"
_HDR_TRACESTATE = "a2a_hdr_tracestate"
_PARSE_LIMIT = 64 * 1024  # answers larger than this are not parsed for task ids


def enable(tracer: Any) -> None:
    global ENABLED, _tracer, _propagator, _kinds
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _tracer, _propagator, _kinds = tracer, TraceContextTextMapPropagator(), SpanKind
    ENABLED = True


def disable() -> None:
    global ENABLED, _tracer
    ENABLED = False
    _tracer = None


def _ids(obj: Any) -> tuple[str | None, str | None]:
    """(task id, context id) of a request's params or an answer's result, A2A 0.3 or 1.0."""
    if not isinstance(obj, dict):
        return None, None
    for key in ("message", "task", "statusUpdate", "artifactUpdate"):
        inner = obj.get(key)
        if isinstance(inner, dict):
            obj, is_message = inner, key == "message"
            break
    else:
        is_message = obj.get("kind") == "message" or "messageId" in obj
    task = obj.get("taskId")
    if task is None and not is_message:
        task = obj.get("id")  # a Task, or tasks/get / GetTask params
    context = obj.get("contextId")
    return (task if isinstance(task, str) else None, context if isinstance(context, str) else None)


def _context_of(traceparent: str | None, tracestate: str | None) -> Any:
    """The parent context a W3C ``traceparent`` names (None: start a new trace)."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    return _propagator.extract(carrier)


def _inject(span: Any, tags: dict[str, str], *, envelope: bool) -> None:
    # W3C traceparent written from the span context directly: the propagator's generic
    # inject (a context object, a setter) costs several times more per call.
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return
    parent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    state = ctx.trace_state.to_header() if ctx.trace_state else ""
    tags[_HDR_TRACEPARENT] = parent  # what the agent receives
    if state:
        tags[_HDR_TRACESTATE] = state
    if envelope:
        tags[env.TAG_TRACEPARENT] = parent
        if state:
            tags[env.TAG_TRACESTATE] = state


class CallTrace:
    """The entry node's span of one call; wraps the ASGI ``send`` to see what the caller got."""

    __slots__ = ("span", "_send", "status", "executed", "response_bytes")

    def __init__(self, span: Any, send: Any) -> None:
        self.span = span
        self._send = send
        self.status: int | None = None
        self.executed: bool | None = None
        self.response_bytes = 0

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            for name, value in message.get("headers") or ():
                if name == b"x-a2a-executed":
                    self.executed = value == b"true"
        elif message["type"] == "http.response.body":
            self.response_bytes += len(message.get("body") or b"")
        await self._send(message)

    def flow_controlled(self, wrap: Callable[[Any], Any]) -> None:
        """Apply the stream relay's flow control to the server's own ``send`` beneath."""
        self._send = wrap(self._send)

    def end(self, outcome: str) -> None:
        span = self.span
        attributes: dict[str, Any] = {
            "a2a.outcome": outcome,
            "a2a.response_bytes": self.response_bytes,
        }
        if self.executed is not None:
            attributes["a2a.executed"] = self.executed
        if self.status is not None:
            attributes["http.response.status_code"] = self.status
        span.set_attributes(attributes)  # one lock round, not one per attribute
        if outcome not in ("ok", "agent_error", "client_disconnect"):
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, outcome))
        span.end()


def _entry_attributes(agent_id: str, binding: str, method: str, request_bytes: int,
                      node_id: str, caller: str,
                      payload: dict[str, Any] | None) -> dict[str, Any]:
    """An entry span's attributes (every binding's: a JSON-RPC call is also
    ``rpc.system=jsonrpc``), with the task and context ids the request names."""
    task_id, context_id = _ids(payload.get("params") if payload else None)
    attributes: dict[str, Any] = {
        "a2a.agent_id": agent_id,
        "a2a.binding": binding,
        "rpc.method": method,
        "a2a.request_bytes": request_bytes,
        "a2a.node": node_id,
        "a2a.caller_id": caller,
    }
    if binding == "JSONRPC":
        attributes["rpc.system"] = "jsonrpc"
    if task_id:
        attributes["a2a.task_id"] = task_id
    if context_id:
        attributes["a2a.context_id"] = context_id
    return attributes


def start_call(
    send: Any,
    *,
    agent_id: str,
    method: str,
    payload: dict[str, Any] | None,
    request_bytes: int,
    tags: dict[str, str],
    caller: str,
    node_id: str,
    binding: str = "JSONRPC",
) -> CallTrace:
    """Open the entry span (continuing the caller's trace) and put its context in ``tags``.
    ``binding``: the A2A protocol binding of the call (``a2a.binding``; a JSON-RPC call is
    also ``rpc.system=jsonrpc``)."""
    parent = _context_of(tags.get(_HDR_TRACEPARENT), tags.get(_HDR_TRACESTATE))
    attributes = _entry_attributes(agent_id, binding, method, request_bytes, node_id, caller,
                                   payload)
    span = _tracer.start_span(
        f"a2a {method}", context=parent, kind=_kinds.SERVER, attributes=attributes
    )
    _inject(span, tags, envelope=True)
    return CallTrace(span, send)


class _TracedSink:
    """The subscriber's span of one call: watches the reply messages and ends with the last."""

    __slots__ = ("span", "sink", "response_bytes", "attributes", "arm_ack")

    def __init__(self, span: Any, sink: Any) -> None:
        self.span = span
        self.sink = sink
        self.response_bytes = 0
        self.attributes: dict[str, Any] | None = {}  # None once the span has ended
        arm = getattr(sink, "arm_ack", None)  # the broker sink's ack timer, kept reachable
        if arm is not None:
            self.arm_ack = arm

    async def __call__(self, message: dict[str, Any]) -> None:
        kind = message["k"]
        if kind == env.START:
            body = message["body"]
            self.response_bytes += len(body)
            attributes = self.attributes
            if attributes is not None:
                attributes["http.response.status_code"] = message["status"]
                attributes["a2a.executed"] = True
                if not message["sse"] and not message["more"] and len(body) <= _PARSE_LIMIT:
                    _answer_ids(attributes, body)
            if not message["more"]:
                error = message["status"] >= 400 or (not message["sse"]
                                                      and is_error_reply(body))
                self._end("agent_error" if error else "ok")
        elif kind == env.CHUNK:
            self.response_bytes += len(message["body"])
            if not message["more"]:
                self._end("ok")
        elif kind == env.ERROR:
            attributes = self.attributes
            if attributes is not None and "a2a.executed" not in attributes:
                # the subscriber's exact answer (outbound.errors.classify): whether the agent
                # may have received the request
                attributes["a2a.executed"] = bool(message.get("executed", False))
            self._end(message["kind"])
        await self.sink(message)

    def __del__(self) -> None:
        # A stream cancelled because its caller left sends no last message: its task drops the
        # sink when it ends, and the span ends with it.
        if self.attributes is not None:
            self._end("cancelled")

    def _end(self, outcome: str) -> None:
        attributes = self.attributes
        if attributes is None:
            return
        self.attributes = None
        attributes["a2a.outcome"] = outcome
        attributes["a2a.response_bytes"] = self.response_bytes
        span = self.span
        span.set_attributes(attributes)
        if outcome not in ("ok", "agent_error", "cancelled"):
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, outcome))
        span.end()


def _answer_ids(attributes: dict[str, Any], body: bytes) -> None:
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    task_id, context_id = _ids(answer.get("result") if isinstance(answer, dict) else None)
    if task_id:
        attributes["a2a.task_id"] = task_id
    if context_id:
        attributes["a2a.context_id"] = context_id


def subscriber_sink(
    query: dict[str, Any], sink: Any, *, agent_id: str, endpoint: str, local: bool, node_id: str
) -> Any:
    """Open the subscriber's span under the envelope's context, point the agent's
    ``traceparent`` at it, and return the sink that ends it with the call."""
    tags = query["tags"]
    parent = _context_of(tags.get(env.TAG_TRACEPARENT), tags.get(env.TAG_TRACESTATE))
    method = tags.get(env.TAG_METHOD, "")
    rest = env.TAG_HTTP_PATH in tags
    attributes = {
        "a2a.agent_id": agent_id,
        "a2a.binding": "HTTP+JSON" if rest else "JSONRPC",
        "rpc.method": method,
        "a2a.node": node_id,
        "a2a.local": local,
        "server.address": endpoint,
        "a2a.request_bytes": len(query.get("body") or b""),
    }
    if not rest:
        attributes["rpc.system"] = "jsonrpc"
    span = _tracer.start_span(
        f"a2a.agent {method}", context=parent, kind=_kinds.CLIENT, attributes=attributes
    )
    _inject(span, tags, envelope=False)
    return _TracedSink(span, sink)


# --- calls this node makes to an agent's gRPC server itself ------------------------------------


class DirectCallTrace:
    """The spans of a call the node taking it makes to the agent's gRPC server itself (gRPC
    pass-through, or a call translated to a gRPC-only agent): the entry span (SERVER, the
    caller's trace continued) and its child (CLIENT, the agent's call) on the same node, as a
    local fast-path call has them. ``traceparent``/``tracestate``: the client span's context,
    what the agent receives."""

    __slots__ = ("entry", "client", "traceparent", "tracestate", "ended")

    def __init__(self, entry: Any, client: Any, traceparent: str, tracestate: str) -> None:
        self.entry = entry
        self.client = client
        self.traceparent = traceparent
        self.tracestate = tracestate
        self.ended = False

    def agent_metadata(self, metadata: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """``metadata`` (the agent's, under the header rules) with the client span's context
        instead of the caller's ``traceparent``/``tracestate``."""
        out = [(k, v) for k, v in metadata if k not in ("traceparent", "tracestate")]
        if self.traceparent:
            out.append(("traceparent", self.traceparent))
        if self.tracestate:
            out.append(("tracestate", self.tracestate))
        return out

    def end(self, outcome: str, *, executed: bool, status: int, response_bytes: int) -> None:
        """End both spans with the call's outcome (``status``: the HTTP status of the
        outcome, the binding's table; ``executed``: whether a byte reached the agent)."""
        if self.ended:
            return
        self.ended = True
        attributes: dict[str, Any] = {"a2a.executed": executed,
                                      "a2a.response_bytes": response_bytes}
        if status:
            attributes["http.response.status_code"] = status
        # A caller that left: ``client_disconnect`` on the entry span, ``cancelled`` on the
        # agent call's (as the subscriber's span says it).
        left = outcome == "client_disconnect"
        for span, named in ((self.client, "cancelled" if left else outcome),
                            (self.entry, outcome)):
            span.set_attributes({**attributes, "a2a.outcome": named})
            if not left and outcome not in ("ok", "agent_error"):
                from opentelemetry.trace import Status, StatusCode

                span.set_status(Status(StatusCode.ERROR, outcome))
            span.end()


def start_direct_call(*, agent_id: str, method: str, binding: str, traceparent: str | None,
                      tracestate: str | None, payload: dict[str, Any] | None,
                      request_bytes: int, caller: str, node_id: str,
                      endpoint: str) -> DirectCallTrace:
    """Open the spans of a call this node makes to the agent's gRPC server itself: the entry
    span continuing the caller's ``traceparent`` (``binding``: the caller's), and the agent
    call's span under it (``a2a.binding=GRPC``, ``rpc.system=grpc``), whose context the agent
    gets (:meth:`DirectCallTrace.agent_metadata`)."""
    parent = _context_of(traceparent, tracestate)
    attributes = _entry_attributes(agent_id, binding, method, request_bytes, node_id, caller,
                                   payload)
    entry = _tracer.start_span(f"a2a {method}", context=parent, kind=_kinds.SERVER,
                               attributes=attributes)
    from opentelemetry import trace

    client_attributes: dict[str, Any] = {
        "a2a.agent_id": agent_id,
        "a2a.binding": "GRPC",
        "rpc.system": "grpc",
        "rpc.method": method,
        "a2a.node": node_id,
        "a2a.local": True,
        "server.address": endpoint,
        "a2a.request_bytes": request_bytes,
    }
    for name in ("a2a.task_id", "a2a.context_id"):  # the request's ids, as the entry's
        if name in attributes:
            client_attributes[name] = attributes[name]
    client = _tracer.start_span(f"a2a.agent {method}",
                                context=trace.set_span_in_context(entry),
                                kind=_kinds.CLIENT, attributes=client_attributes)
    tags: dict[str, str] = {}
    _inject(client, tags, envelope=False)
    return DirectCallTrace(entry, client, tags.get(_HDR_TRACEPARENT, ""),
                           tags.get(_HDR_TRACESTATE, ""))
