"""The gateway's check for an agent's own JSON-RPC error (``gateway.jsonrpc.is_error_reply``,
``events_have_error``): a top-level ``error`` member counts; ``"error"`` anywhere else -- a
nested key, a string value, text inside a string, a batch -- does not; only the head of a
body is read."""

from __future__ import annotations

import orjson
import pytest

from gateway.jsonrpc import ERROR_HEAD_BYTES, events_have_error, is_error_reply


@pytest.mark.parametrize(("body", "expected"), [
    (b'{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"Method not found"}}', True),
    (b'{"error":{"code":-32000,"message":"x"},"id":"a","jsonrpc":"2.0"}', True),
    (b' \n{"id": 1, "error" : null}', True),
    (b'{"jsonrpc":"2.0","id":1,"result":{"error":{"code":1}}}', False),
    (b'{"jsonrpc":"2.0","id":"error","result":1}', False),
    (b'{"jsonrpc":"2.0","id":"\\"error\\":","result":1}', False),
    (b'{"jsonrpc":"2.0","id":1,"result":[{"error":1}]}', False),
    (b'[{"jsonrpc":"2.0","id":1,"error":{"code":1}}]', False),
    (b'"error"', False),
    (b'plain text "error": 1', False),
    (b"", False),
])
def test_top_level_error_member_only(body: bytes, expected: bool):
    assert is_error_reply(body) is expected
    if body.strip().startswith(b"{"):  # the check agrees with a whole parse
        assert ("error" in orjson.loads(body)) is expected


def test_only_the_head_is_read():
    late = b'{"jsonrpc":"2.0","id":"' + b"i" * ERROR_HEAD_BYTES + b'","error":{"code":1}}'
    assert not is_error_reply(late)  # documented: an id longer than the head hides it
    big = orjson.dumps({"jsonrpc": "2.0", "id": 1,
                        "error": {"code": -32000, "message": "m", "data": "x" * 10_000_000}})
    assert is_error_reply(big)
    big_ok = orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": {"text": "x" * 10_000_000,
                                                               "error": 1}})
    assert not is_error_reply(big_ok)


def test_event_stream_error_events():
    ok = b'event: message\ndata: {"jsonrpc":"2.0","id":1,"result":{"error":"nested"}}\n\n'
    error = b'data: {"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"m"}}\n\n'
    assert not events_have_error(ok)
    assert not events_have_error(b": keepalive\n\n")
    assert events_have_error(ok + error)
    assert events_have_error(error.replace(b"\n", b"\r\n"))
    assert not events_have_error(b'data: "error"\n\n')
