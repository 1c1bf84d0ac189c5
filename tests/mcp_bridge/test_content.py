"""How an agent's reply parts become MCP content (both A2A shapes), without a server."""

from __future__ import annotations

import mcp_types as types
import orjson

from gateway.inprocess import Reply
from mcp_bridge.calls import tool_result


def _reply(result: dict) -> Reply:
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": result})
    return Reply(200, {"content-type": "application/json"}, body, False)


def test_parts_of_both_shapes_become_mcp_content():
    v03 = {"kind": "message", "role": "agent", "messageId": "m", "contextId": "c", "parts": [
        {"kind": "text", "text": "hello"},
        {"kind": "data", "data": {"total": 42}},
        {"kind": "file", "file": {"bytes": "iVBORw0=", "mimeType": "image/png", "name": "a.png"}},
        {"kind": "file", "file": {"bytes": "JVBERi0=", "mimeType": "application/pdf",
                                  "name": "invoice.pdf"}},
        {"kind": "file", "file": {"uri": "https://files.example/r.csv", "mimeType": "text/csv",
                                  "name": "r.csv"}},
    ]}
    v10 = {"message": {"role": "ROLE_AGENT", "messageId": "m", "contextId": "c", "parts": [
        {"text": "hello"},
        {"data": {"total": 42}},
        {"raw": "iVBORw0=", "mediaType": "image/png", "filename": "a.png"},
        {"raw": "JVBERi0=", "mediaType": "application/pdf", "filename": "invoice.pdf"},
        {"url": "https://files.example/r.csv", "mediaType": "text/csv", "filename": "r.csv"},
    ]}}
    for result in (v03, v10):
        mapped = tool_result("files", _reply(result), 1 << 20)
        assert not mapped.is_error
        text, data, image, blob, link = mapped.content
        assert text == types.TextContent(text="hello")
        assert data == types.TextContent(text='{"total":42}')
        assert image == types.ImageContent(data="iVBORw0=", mime_type="image/png")
        assert blob.resource.uri == "a2a://files/files/invoice.pdf"
        assert blob.resource.blob == "JVBERi0=" and blob.resource.mime_type == "application/pdf"
        assert (link.uri, link.name, link.mime_type) == (
            "https://files.example/r.csv", "r.csv", "text/csv")
        assert mapped.structured_content == {"agent_id": "files", "context_id": "c"}


def test_a_failed_task_and_an_agents_own_error_are_tool_errors():
    failed = tool_result("agent-x", _reply({"kind": "task", "id": "t-1", "contextId": "c",
                                            "status": {"state": "TASK_STATE_FAILED", "message": {
                                                "parts": [{"text": "no stock"}]}}}), 1 << 20)
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1,
                         "error": {"code": -32001, "message": "Task not found"}})
    own = tool_result("agent-x", Reply(200, {}, body, False), 1 << 20)
    not_rpc = tool_result("agent-x", Reply(502, {}, b"<html>bad gateway</html>", False), 1 << 20)

    assert failed.is_error and [c.text for c in failed.content] == [
        "task t-1 of agent-x failed", "no stock"]
    assert failed.structured_content["state"] == "failed"
    assert own.is_error and own.content[0].text == "agent error -32001: Task not found"
    assert not_rpc.is_error and "answered HTTP 502 without a JSON-RPC response" \
        in not_rpc.content[0].text
