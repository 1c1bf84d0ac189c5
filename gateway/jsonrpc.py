"""Reading a JSON-RPC request body on the hot path: whether it is one valid JSON document, and
of it only what the gateway reads -- ``jsonrpc``, ``id``, ``method`` and
``params.configuration.timeout`` (of an HTTP+JSON binding's body: ``configuration.timeout``).
The body itself is forwarded unchanged.

Up to :data:`LAZY_ABOVE_BYTES` a body is parsed whole by orjson (about 1 µs for 1 KiB). Above
it, materialising the whole request costs far more than the gateway needs of it (orjson: about
90 µs for a 256 KiB text part, 1.2 ms for 256 KiB of structured parts), so pysimdjson validates
the document -- every byte, UTF-8 included -- without building Python objects, and only the
fields above are built (about 3x and 6x faster). Where its answer could differ from orjson's,
orjson decides: a UTF-8 byte order mark (simdjson skips one, orjson refuses it), a duplicate
key at a level that is read (simdjson's lookup takes the first, orjson and most agents the
last), a top-level value that is not an object, and anything simdjson refuses (invalid JSON,
integers past 64 bits, depth past 1024). So every body gets the answer a whole orjson parse
would give it; ``tests/gateway/test_jsonrpc_parse.py`` holds the two parses equal.

A body that is not JSON gets a -32700 saying when its Content-Type was not JSON either
(:func:`invalid_json_detail`).
"""

from __future__ import annotations

import re
import threading
from typing import Any

import orjson
import simdjson

#: Bodies above this size take the lazy parse (below it orjson's whole parse is as fast).
LAZY_ABOVE_BYTES = 16 * 1024
#: A body above this size gets a parser of its own, dropped afterwards: a reused parser keeps
#: buffers sized to the largest document it has parsed, so a hostile 10 MiB body would
#: otherwise leave tens of MiB behind.
REUSE_PARSER_UP_TO_BYTES = 1024 * 1024
_BOM = b"\xef\xbb\xbf"
_TOP_LEVEL = ("jsonrpc", "id", "method")
_local = threading.local()


class _Whole(Exception):
    """The lazy parse declines: the whole parse decides."""


#: Where the caller's timeout is: JSON-RPC ``params.configuration.timeout``; the HTTP+JSON
#: binding's request bodies are the params themselves (``configuration.timeout``).
_JSONRPC_TIMEOUT = ("params", "configuration", "timeout")
_REST_TIMEOUT = ("configuration", "timeout")


def parse_request(body: bytes, *, whole: bool = False, rest: bool = False) -> Any:
    """The request body as the gateway reads it: for a JSON object a dict holding at least
    ``jsonrpc``, ``id``, ``method`` and ``params.configuration.timeout`` where the body has
    them (a small body, or ``whole``, gives the whole request); for any other JSON value that
    value. Raises :class:`orjson.JSONDecodeError` when the body is not valid JSON. ``rest``: a
    body of the HTTP+JSON binding, of which only ``configuration.timeout`` is read."""
    if whole or len(body) <= LAZY_ABOVE_BYTES or body.startswith(_BOM):
        return orjson.loads(body)
    try:
        if rest:
            return _skeleton(body, (), _REST_TIMEOUT)
        return _skeleton(body, _TOP_LEVEL, _JSONRPC_TIMEOUT)
    # declined, or refused by simdjson (ValueError: invalid JSON; RuntimeError: big integers,
    # depth): the whole parse decides
    except (_Whole, ValueError, RuntimeError):
        return orjson.loads(body)


def _skeleton(body: bytes, top: tuple[str, ...], timeout_at: tuple[str, ...]
              ) -> dict[str, Any]:
    if len(body) > REUSE_PARSER_UP_TO_BYTES:
        parser = simdjson.Parser()
    else:
        parser = getattr(_local, "parser", None)  # type: ignore[assignment]  # None: made below
        if parser is None:
            parser = _local.parser = simdjson.Parser()
    document = parser.parse(body)
    if not isinstance(document, simdjson.Object):
        raise _Whole  # a batch, or not a request: the whole parse words the refusal
    # Members are looked up only by names known to be there: simdjson signals a missing key
    # with a C++ exception, which costs more than the lookup.
    keys = _unique_keys(document)
    skeleton = {key: _value(document[key]) for key in top if key in keys}
    *parents, leaf = timeout_at
    level: Any = document
    for name in parents:  # down to the object holding the timeout, if the body has it
        if name not in keys:
            return skeleton
        level = level[name]
        if not isinstance(level, simdjson.Object):
            return skeleton
        keys = _unique_keys(level)
    if leaf in keys:
        holder = skeleton
        for name in parents:
            holder = holder.setdefault(name, {})
        holder[leaf] = _value(level[leaf])
    # Nothing of the parser's document may outlive this call: the next parse reuses it.
    return skeleton


def _unique_keys(obj: simdjson.Object) -> set[str]:
    """The member names of ``obj``; the whole parse decides when one stands twice."""
    keys = set(obj.keys())
    if len(keys) != len(obj):
        raise _Whole
    return keys


def _value(value: Any) -> Any:
    """A plain Python value of a simdjson one (objects and arrays built whole)."""
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value


# --- the agent's reply: is it a JSON-RPC error? -------------------------------------------------

#: How much of a reply (or of one SSE event's data) is looked at for a top-level ``"error"``
#: member. A JSON-RPC response has three or four short members (``jsonrpc``, ``id`` and
#: ``result`` or ``error``), so the ``error`` key stands in the first few dozen bytes whatever
#: their order, unless the ``id`` itself is kilobytes long; only this much is ever scanned, so
#: the check costs the same for a 10 MiB answer as for a small one.
ERROR_HEAD_BYTES = 4096
_ERROR_KEY = b'"error"'
#: The tokens that decide a member's depth: strings (escapes included) and brackets.
_DEPTH_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]]')
_SPACE = b" \t\r\n"


def is_error_reply(body: bytes) -> bool:
    """Whether an agent's reply is a JSON-RPC error response: a JSON object with an ``error``
    member at its top level (within its first :data:`ERROR_HEAD_BYTES`).

    Never a parse of the body: a substring search of the head (the common answer, a
    ``result``, stops there), then, only when ``"error"`` stands in it, one regular-expression
    pass over the head that tracks the nesting depth, so ``"error"`` inside a result (a task's
    text, a nested object) does not count, nor does an ``"error"`` string value. Measured on
    the 2-core development machine (timeit, best of 5): 0.2 µs for a 165-byte result, 1.7 µs
    for a 1 MiB one (the bounded search), 3 µs for an error reply (the depth pass)."""
    if body.find(_ERROR_KEY, 0, ERROR_HEAD_BYTES) < 0:
        return False
    head = body[:ERROR_HEAD_BYTES]
    if head.lstrip(_SPACE)[:1] != b"{":
        return False  # not one JSON object
    depth = 0
    for match in _DEPTH_TOKENS.finditer(head):
        token = match.group()
        first = token[0]
        if first == 0x22:  # a string: the error key when at depth 1 and followed by ':'
            if depth == 1 and token == _ERROR_KEY:
                rest = head[match.end():match.end() + 16].lstrip(_SPACE)
                if rest[:1] == b":":
                    return True
        elif first in (0x7B, 0x5B):  # { [
            depth += 1
        else:
            depth -= 1
            if depth <= 0:
                return False  # the top-level object ended
    return False


def events_have_error(events: bytes) -> bool:
    """Whether a run of complete SSE events holds a JSON-RPC error event (an event whose
    ``data`` is a JSON-RPC error response, as A2A SDK servers end a failed stream). Costs one
    substring search of the chunk unless ``"error"`` stands in it; then each ``data:`` line
    holding it is checked with :func:`is_error_reply` (a JSON document split over several
    ``data:`` lines is checked from its first line)."""
    if _ERROR_KEY not in events:
        return False
    for line in events.splitlines():
        if line.startswith(b"data:") and _ERROR_KEY in line:
            if is_error_reply(line[5:].lstrip(b" ")):
                return True
    return False


def invalid_json_detail(content_type: bytes) -> str:
    """The -32700 message: says when the declared media type was not JSON either."""
    declared = media_type(content_type)
    if not declared or is_json_media_type(declared):
        return "invalid JSON"
    return f"invalid JSON (Content-Type {declared.decode('latin-1')} is not JSON)"


def media_type(content_type: bytes) -> bytes:
    """The media type of a Content-Type value, lower-cased, parameters dropped."""
    return content_type.split(b";", 1)[0].strip().lower()


def is_json_media_type(media: bytes) -> bool:
    """``application/json`` and every ``+json`` structured syntax (RFC 6839)."""
    return media == b"application/json" or media.endswith(b"+json")

