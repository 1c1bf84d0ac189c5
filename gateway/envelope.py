"""The Query envelope a request becomes, and the reply messages that answer it.

A Query travels on ``_AGENTS_.{agent_id}`` (or is handed straight to the in-process subscriber
on the local fast path) as a plain dict, so both Channels layers carry it unchanged::

    {"type": "a2a.query", "body": <request bytes>, "tags": {
        "a2a_method": "message/send", "a2a_hdr_<name>": "<value>", ...,
        "a2a_timeout": "300", "a2a_caller_id": "<client id>",
        "a2a_reply_channel": "<gateway reply channel>", "a2a_request_id": "<uuid>",
        "a2a_http_method": "GET", "a2a_http_path": "/tasks/t-1"}}  (HTTP+JSON calls only)

Replies go to the reply channel, each naming the request (``i``). ``k`` is the message kind:

- ``s`` start: the agent answered; ``status``, ``headers``, first ``body`` bytes, ``more``,
  ``sse`` (whether the body is an event stream)
- ``c`` chunk: more ``body`` bytes, ``more``
- ``e`` error: a transport error ``kind`` with ``detail`` (and the agent's ``status`` when it
  answered 502/503/504) and ``executed`` (whether the agent may have received the request);
  before a start it is the whole reply, after one it ends the stream
- ``a`` ack: the subscriber has the request and is still working (sent only for slow requests
  through the broker, so the gateway can tell "no live subscriber" from "slow agent")
- ``p`` piece: the next part of the previous message's ``body`` (below)

Through the broker (gateway.broker_sink.BrokerSink) every reply but an ack is **numbered**: ``n``
counts a request's messages from 1, so the entry node detects a lost one (a gap) instead of
relaying around it; and a message whose ``body`` is larger than :data:`PIECE_BYTES` crosses in
pieces: the message itself with the first ``PIECE_BYTES`` of its body and ``pc`` (how many
pieces follow), then ``pc`` piece messages (each numbered too), which the entry node joins back
into the one message before it is relayed (gateway.inbox.Reassembly). Pieces are sent only to
an entry node that asked for them (the ``a2a_pieces`` tag below).

**Endings.** A lost *last* message leaves no later number to show the gap, so after a call's
last reply message (an error, or a start or chunk without ``more``) the owner tells the entry
node where the call ended: an ``a2a.ended`` message on the reply channel,
``{"type": "a2a.ended", "calls": {<request id>: <number of its last reply message>, ...}}``,
one per reply channel and beat for every call that ended there lately, sent
:data:`ENDED_REPEATS` times :data:`ENDED_EVERY_SECONDS` apart (gateway.endings); the same
message names, for each call of several messages still running, the number of its last message
whose publish is over. The entry node still waiting for a number at or below it has lost it:
the call ends with ``stream_gap`` at once (gateway.inbox.Reassembly.ended). A node of an older
version ignores the message (it is no reply and no registry event).

**Grants.** A Query's ``a2a_grant`` tag (an entry node that has a node-wide budget for what
Redis holds for it, gateway.grants) says the owner sends the pieces of a large message only as
far as the entry node allows: cumulative piece bytes, starting from the tag's value and raised
by ``stream_credit`` messages carrying ``a2a_granted``; the message itself (with its first
piece) needs no grant. Without the tag, pieces cross as before.
"""

from __future__ import annotations

from typing import Any

QUERY = "a2a.query"
REPLY = "a2a.reply"
ENDED = "a2a.ended"
#: How often the owner repeats where its calls ended, and how many times (gateway.endings):
#: the notice outlives a publishing connection lost with the call's last message.
ENDED_EVERY_SECONDS = 1.0
ENDED_REPEATS = 3

TAG_METHOD = "a2a_method"
TAG_TIMEOUT = "a2a_timeout"
TAG_CALLER = "a2a_caller_id"
TAG_REPLY_CHANNEL = "a2a_reply_channel"
TAG_REQUEST_ID = "a2a_request_id"
TAG_RPC_ID = "a2a_rpc_id"  # the caller's JSON-RPC id (for stream_cancel towards the agent)
TAG_STREAM_ID = "a2a_stream_id"  # stream_cancel: the request id of the stream to cancel
# The HTTP+JSON binding (gateway.rest): the request's HTTP method, and its path and query after
# the agent's gateway base, which the subscriber appends to the agent's HTTP+JSON interface URL.
# Absent: a JSON-RPC call, POSTed to the agent's endpoint.
TAG_HTTP_METHOD = "a2a_http_method"
TAG_HTTP_PATH = "a2a_http_path"
# W3C trace context of the entry node's span (gateway.tracing; only when tracing is on)
TAG_TRACEPARENT = "a2a_traceparent"
TAG_TRACESTATE = "a2a_tracestate"

START = "s"
CHUNK = "c"
ERROR = "e"
ACK = "a"
PIECE = "p"

#: The largest body one reply message carries through the broker (larger ones cross in pieces):
#: a message queued by Redis for a subscriber stays far below its pub/sub output-buffer limits
#: (``client-output-buffer-limit pubsub 32mb 8mb 60`` by default).
PIECE_BYTES = 64 * 1024

#: Methods the SSE handler serves (A2A 0.3 and 1.0 names).
STREAMING_METHODS = frozenset(
    {"message/stream", "tasks/resubscribe", "SendStreamingMessage", "SubscribeToTask"}
)
CANCEL_METHOD = "stream_cancel"
#: Stream flow control through the broker: a Query's ``a2a_window`` tag is how many body bytes
#: the owner may send ahead of what the caller has read; ``stream_credit`` messages (tags
#: ``a2a_stream_id`` and ``a2a_credit``: cumulative bytes delivered to the caller) move it on.
CREDIT_METHOD = "stream_credit"
TAG_WINDOW = "a2a_window"
TAG_CREDIT = "a2a_credit"
#: Pieces (above): a Query's ``a2a_pieces`` tag says the entry node joins pieces of at most that
#: many bytes (an entry node without it gets whole messages); a ``stream_credit``'s
#: ``a2a_received`` is how many bytes of pieced messages it has taken from the broker so far,
#: so the pieces of one large message too cross at most a window at a time.
TAG_PIECES = "a2a_pieces"
TAG_RECEIVED = "a2a_received"
#: Grants (above): a Query's ``a2a_grant``, a ``stream_credit``'s ``a2a_granted``.
TAG_GRANT = "a2a_grant"
TAG_GRANTED = "a2a_granted"
#: Resumable streams (gateway.resume): ``stream_resume`` reattaches a caller to the stream named
#: by ``a2a_stream_id`` (its public stream id), replaying the events after ``a2a_last_event``.
RESUME_METHOD = "stream_resume"
TAG_LAST_EVENT = "a2a_last_event"
#: A stream opened through the HTTP+JSON binding and translated to the agent's JSON-RPC: the
#: form its stream id names (gateway.resume.stream_form), so a reconnect is re-translated.
TAG_STREAM_FORM = "a2a_stream_form"
# Ownership handover on a broadcasting layer (gateway.handover): a new owner's
# subscriber publishes a probe until it hears its own, then a takeover; both carry its nonce.
PROBE_METHOD = "a2a_probe"
TAKEOVER_METHOD = "a2a_takeover"
TAG_NONCE = "a2a_nonce"


def query(body: bytes, tags: dict[str, str]) -> dict[str, Any]:
    return {"type": QUERY, "body": body, "tags": tags}


def start(
    request_id: str, status: int, headers: list[tuple[bytes, bytes]], body: bytes, *,
    more: bool, sse: bool,
) -> dict[str, Any]:
    return {"type": REPLY, "i": request_id, "k": START, "status": status, "headers": headers,
            "body": body, "more": more, "sse": sse}


def chunk(request_id: str, body: bytes, *, more: bool) -> dict[str, Any]:
    return {"type": REPLY, "i": request_id, "k": CHUNK, "body": body, "more": more}


def error(
    request_id: str, kind: str, detail: str = "", *, status: int | None = None,
    executed: bool = False,
) -> dict[str, Any]:
    return {"type": REPLY, "i": request_id, "k": ERROR, "kind": kind, "detail": detail,
            "status": status, "executed": executed}


def ack(request_id: str) -> dict[str, Any]:
    return {"type": REPLY, "i": request_id, "k": ACK}


def piece(request_id: str, body: bytes) -> dict[str, Any]:
    return {"type": REPLY, "i": request_id, "k": PIECE, "body": body}


def ended(calls: dict[str, int]) -> dict[str, Any]:
    return {"type": ENDED, "calls": calls}


def is_last(message: dict[str, Any]) -> bool:
    """Whether a reply message is its call's last one (an error, or an end of the body)."""
    kind = message.get("k")
    return kind == ERROR or (kind in (START, CHUNK) and not message.get("more"))
