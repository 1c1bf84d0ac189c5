"""The caller's side of one gateway call: the :class:`Exchange` state machine that turns reply
messages (gateway.envelope) into the ASGI response, and the gateway's own error answers
(:func:`send_error`) in the form of the caller's binding -- JSON-RPC, HTTP+JSON (:data:`REST`)
or a :class:`~gateway.binding.BindingCaller` (the gRPC listener, the translated HTTP+JSON
binding)."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from gateway import envelope as env
from gateway import errors
from gateway.binding import BindingCaller
from gateway.bodies import Send
from gateway.jsonrpc import events_have_error, is_error_reply
from gateway.sse import error_event, flow_controlled

logger = logging.getLogger(__name__)

Header = tuple[bytes, bytes]

EXECUTED_FALSE = (b"x-a2a-executed", b"false")
EXECUTED_TRUE = (b"x-a2a-executed", b"true")


class _Rest:
    __slots__ = ()

    def __repr__(self) -> str:
        return "REST"


#: The "request id" of an HTTP+JSON call, which has none: where a JSON-RPC call's id goes
#: (admission, :class:`Exchange`, :func:`send_error`), it makes the gateway's errors take the
#: binding's form.
REST: Any = _Rest()

class Exchange:
    """The caller's side of one request: turns reply messages into the ASGI response."""

    # status / nbytes: what the caller got (HTTP status, response bytes), for the console.
    # outcome: "ok", "agent_error" (the agent answered an HTTP error status, or a JSON-RPC
    # error: gateway.jsonrpc.is_error_reply on a whole body or the head of a large one,
    # events_have_error on each chunk of an event stream), or the gateway's error kind.
    # watch: what is still looked at for an agent error (_WATCH_* below).
    __slots__ = ("send", "rpc_id", "agent_id", "profile", "started", "done", "sse", "outcome",
                 "mapped", "status", "nbytes", "watch")

    def __init__(self, send: Send, rpc_id: Any, agent_id: str, profile: str = "a2a") -> None:
        self.send: Send = send
        self.rpc_id = rpc_id
        self.agent_id = agent_id
        self.profile = profile  # the node's A2A_ERROR_PROFILE
        self.started = False
        self.done = False
        self.sse = False
        self.outcome = "unknown"
        self.mapped = False  # the agent's error status was answered as a JSON-RPC error
        self.status = 0
        self.nbytes = 0
        self.watch = _WATCH_NONE

    async def deliver(self, message: dict[str, Any]) -> None:
        kind = message["k"]
        send = self.send
        if self.done or (kind == env.START and self.started) or (
            kind == env.CHUNK and not self.started
        ):
            # A duplicate or out-of-order reply (e.g. two nodes misconfigured with one NODE_ID
            # both answering): the caller's response is already decided; never break it.
            if kind != env.ACK and not self.mapped:
                logger.warning("ignored an unexpected %s reply for %s", kind, self.agent_id)
            return
        if kind == env.START:
            status = message["status"]
            if status >= 400 and self.profile == "kubemq" and not message["sse"] \
                    and self.rpc_id is not REST and not _is_jsonrpc_answer(message):
                await self._agent_status_error(status, message["more"])
                return
            body = message["body"]
            more = message["more"]
            if not more and status not in (204, 304):
                headers = [*message["headers"], EXECUTED_TRUE, _agent_status(status),
                           (b"content-length", b"%d" % len(body))]
            else:
                headers = [*message["headers"], EXECUTED_TRUE, _agent_status(status)]
            self.started = True
            self.status = status
            self.nbytes = len(body)
            if message["sse"]:
                # Events answer any method (the agent's Content-Type decides): the caller's
                # send must wait while its connection is full, on Daphne too.
                self.sse = True
                if more:
                    self.send = send = flow_controlled(send)
            if status >= 400:
                self.outcome = "agent_error"
            elif not more:
                error = events_have_error(body) if self.sse else is_error_reply(body)
                self.outcome = "agent_error" if error else "ok"
            else:
                self.outcome = "ok"
                self.watch = _WATCH_EVENTS if self.sse else _WATCH_HEAD
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": more})
            self.done = not more
        elif kind == env.CHUNK:
            more = message["more"]
            body = message["body"]
            self.nbytes += len(body)
            watch = self.watch
            if watch and body:
                if watch == _WATCH_HEAD:  # a large body: its first piece holds the head
                    self.watch = _WATCH_NONE
                    if is_error_reply(body):
                        self.outcome = "agent_error"
                elif events_have_error(body):
                    self.watch = _WATCH_NONE
                    self.outcome = "agent_error"
            await send({"type": "http.response.body", "body": body, "more_body": more})
            self.done = not more
        elif kind == env.ERROR:
            await self.fail(message["kind"], message.get("detail") or "",
                            status=message.get("status"), executed=message.get("executed", False))
        # acks carry nothing for the caller

    async def _agent_status_error(self, status: int, more: bool) -> None:
        """Profile kubemq: the agent's HTTP error status (its body not a JSON-RPC answer)
        becomes HTTP 200 with a JSON-RPC error, as KubeMQ documents (error-codes.md): 502 and
        503 -> -32603 "unavailable", 504 -> -32001 "timeout", any other -> -32603 naming the
        status. The agent answered, so executed is true."""
        if status in (502, 503):
            kind, detail = errors.UPSTREAM_UNAVAILABLE, ""
        elif status == 504:
            kind, detail = errors.TIMEOUT, ""
        else:
            kind, detail = errors.AGENT_ERROR, f"agent error: HTTP {status}"
        self.started = True
        self.done = True
        self.mapped = more  # the rest of the agent's body is dropped quietly
        self.outcome = "agent_error"
        body = orjson.dumps({
            "jsonrpc": "2.0", "id": self.rpc_id,
            "error": errors.error_object(kind, agent_id=self.agent_id, detail=detail,
                                         status=status, executed=True),
        })
        await self.send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            EXECUTED_TRUE, (b"x-a2a-agent-status", str(status).encode()),
        ]})
        await self.send({"type": "http.response.body", "body": body})

    async def fail(self, kind: str, detail: str = "", *, status: int | None = None,
                   executed: bool = False) -> None:
        """Answer a transport error: a JSON-RPC error before the reply started, a terminal
        ``event: error`` inside an event stream, an aborted body otherwise."""
        if self.done:
            return
        self.done = True
        if self.outcome in ("unknown", "ok", "agent_error"):
            self.outcome = kind
        if isinstance(self.rpc_id, BindingCaller):  # the binding answers in its own form
            self.status = errors.rest_status_for(kind)
            await self.rpc_id.gateway_error(kind, self.agent_id, detail, status=status,
                                            executed=executed or self.started, extra=None)
            return
        if not self.started:
            self.status = errors.rest_status_for(kind) if self.rpc_id is REST \
                else errors.http_status_for(kind)
            extra = [(b"x-a2a-agent-status", str(status).encode())] if status else []
            await send_error(self.send, kind, self.rpc_id, self.agent_id, detail, extra=extra,
                             status=status, executed=executed)
            return
        if self.sse:
            if self.rpc_id is REST:  # the binding's stream error: data is a google.rpc.Status
                event = error_event(errors.rest_error_object(
                    kind, agent_id=self.agent_id, detail=detail, status=status, executed=True))
            else:
                error = errors.error_object(kind, agent_id=self.agent_id, detail=detail,
                                            status=status, executed=True)
                event = error_event({"jsonrpc": "2.0", "id": self.rpc_id, "error": error})
            await self.send({"type": "http.response.body", "body": event, "more_body": False})
            return
        # A plain body cut short cannot be answered any more: returning without completing the
        # response makes the server close the connection, so the caller sees the truncation.


#: What an Exchange still looks at for the agent's JSON-RPC error: nothing, the first piece
#: of a large body (its head), every chunk of an event stream.
_WATCH_NONE, _WATCH_HEAD, _WATCH_EVENTS = 0, 1, 2

_AGENT_STATUS: dict[int, tuple[bytes, bytes]] = {}


def _agent_status(status: int) -> tuple[bytes, bytes]:
    """The ``X-A2A-Agent-Status`` header of ``status``, built once per status code."""
    header = _AGENT_STATUS.get(status)
    if header is None:
        header = (b"x-a2a-agent-status", b"%d" % status)
        if 100 <= status < 1000:  # a bounded set of keys, whatever the agent answers
            _AGENT_STATUS[status] = header
    return header


def _is_jsonrpc_answer(message: dict[str, Any]) -> bool:
    """Whether a whole reply body is a JSON-RPC 2.0 response (relayed as the agent sent it)."""
    if message["more"]:
        return False  # larger than the subscriber reads whole: not a JSON-RPC error body
    try:
        answer = orjson.loads(message["body"])
    except orjson.JSONDecodeError:
        return False
    return isinstance(answer, dict) and answer.get("jsonrpc") == "2.0" and (
        "error" in answer or "result" in answer)


async def send_error(send: Send, kind: str, rpc_id: Any, agent_id: str | None,
                     detail: str = "", *, extra: list[Header] | None = None,
                     status: int | None = None, executed: bool = False) -> None:
    """Answer a gateway error: a JSON-RPC error with the caller's id, or, for an HTTP+JSON call
    (``rpc_id`` is :data:`REST`), the binding's ``google.rpc.Status`` form and HTTP status."""
    if isinstance(rpc_id, BindingCaller):  # not HTTP: the binding answers in its own form
        await rpc_id.gateway_error(kind, agent_id, detail, status=status, executed=executed,
                                   extra=extra)
        return
    if rpc_id is REST:
        body = errors.rest_error_body(kind, agent_id=agent_id, detail=detail, status=status,
                                      executed=executed)
        http_status = errors.rest_status_for(kind)
    else:
        body = errors.error_body(kind, rpc_id=rpc_id, agent_id=agent_id, detail=detail,
                                 status=status, executed=executed)
        http_status = errors.http_status_for(kind)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        EXECUTED_TRUE if executed else EXECUTED_FALSE,
    ]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": http_status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_plain(send: Send, status: int, body: bytes,
                     extra: list[Header] | None = None) -> None:
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), EXECUTED_FALSE]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def discard(message: dict[str, Any]) -> None:
    """A ``send`` that drops what it gets (a caller answered in another form)."""
    return None
