"""Files and data as tool arguments, with the official MCP Python SDK client: an a2a-sdk agent
whose card takes files and JSON gets them as A2A file and data parts (both protocols), and
what the card does not take, bad base64 and too many bytes are tool errors that say so."""

from __future__ import annotations

import base64

import orjson
import pytest

from tests.mcp_bridge.clients import all_tools, run

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(200))


def _takes_files(echo):
    """The echo agent's card, taking JSON by default and images and PDFs in its skill."""
    card = echo.card_document
    echo.card_document = {**card, "defaultInputModes": ["text/plain", "application/json"],
                          "skills": [{**card["skills"][0],
                                      "inputModes": ["text/plain", "image/*", "application/pdf"]}]}
    return echo


def _received(result) -> list[dict]:
    text = result.content[0].text
    assert text.startswith("parts: "), text
    return orjson.loads(text.removeprefix("parts: "))


@pytest.mark.parametrize("card_shape", ["0.3", "1.0"])
def test_files_and_data_reach_the_agent_as_parts(
        live_server_url, register_agent, echo_agent_factory, caller, card_shape):
    agent = register_agent(_takes_files(echo_agent_factory(card_shape=card_shape)))

    async def use(client):
        tools = {tool.name: tool for tool in await all_tools(client)}
        result = await client.call_tool(agent.agent_id, {
            "message": "parts please", "data": {"invoice": 42},
            "files": [{"name": "scan.png", "mimeType": "image/png",
                       "data": base64.b64encode(PNG).decode()},
                      {"name": "terms.pdf", "mimeType": "application/pdf",
                       "uri": "https://files.example/terms.pdf"}]})
        return tools[agent.agent_id], result

    tool, result = run(live_server_url, caller.token, use)

    files = tool.input_schema["properties"]["files"]
    assert files["type"] == "array" and files["items"]["required"] == ["mimeType"]
    assert "application/pdf, image/*" in files["description"]
    assert tool.input_schema["properties"]["data"]["type"] == "object"
    assert not result.is_error, result.content
    assert _received(result) == [
        {"kind": "text", "text": "parts please"},
        {"kind": "data", "data": {"invoice": 42}},
        {"kind": "raw", "filename": "scan.png", "media_type": "image/png", "size": len(PNG),
         "head": PNG[:16].decode("latin-1")},
        {"kind": "url", "filename": "terms.pdf", "media_type": "application/pdf",
         "url": "https://files.example/terms.pdf"},
    ]


@pytest.fixture
def small_files(settings) -> None:
    settings.A2A_MCP_MAX_FILE_BYTES = 1000
    settings.A2A_MCP_MAX_FILES = 2


def test_files_the_agent_does_not_take_are_refused_clearly(
        small_files, live_server_url, register_agent, echo_agent_factory, caller):
    takes = register_agent(_takes_files(echo_agent_factory()))
    plain = register_agent(echo_agent_factory())
    png = {"mimeType": "image/png", "data": base64.b64encode(PNG).decode()}

    async def use(client):
        calls = {
            "plain": (plain.agent_id, {"message": "x", "files": [png]}),
            "video": (takes.agent_id, {"message": "x", "files": [
                {"mimeType": "video/mp4", "data": "AAAA"}]}),
            "base64": (takes.agent_id, {"message": "x", "files": [
                {"mimeType": "image/png", "data": "not base64!"}]}),
            "both": (takes.agent_id, {"message": "x", "files": [
                {**png, "uri": "https://files.example/a.png"}]}),
            "scheme": (takes.agent_id, {"message": "x", "files": [
                {"mimeType": "image/png", "uri": "file:///etc/passwd"}]}),
            "large": (takes.agent_id, {"message": "x", "files": [
                {"mimeType": "image/png", "data": base64.b64encode(bytes(1500)).decode()}]}),
            "many": (takes.agent_id, {"message": "x", "files": [png, png, png]}),
        }
        answers = {key: await client.call_tool(name, arguments)
                   for key, (name, arguments) in calls.items()}
        listed = {tool.name: tool for tool in await all_tools(client)}
        return answers, listed

    answers, listed = run(live_server_url, caller.token, use)

    assert "files" not in listed[plain.agent_id].input_schema["properties"]
    expected = {
        "plain": "this agent takes no files",
        "video": "files[0].mimeType video/mp4 is not among the media types the agent takes",
        "base64": "files[0].data is not valid base64",
        "both": "files[0] needs either data (base64) or uri",
        "scheme": "files[0].uri must be an http(s) URL",
        "large": "files larger than 1000 bytes in all (A2A_MCP_MAX_FILE_BYTES)",
        "many": "at most 2 files per call (A2A_MCP_MAX_FILES)",
    }
    for key, text in expected.items():
        answer = answers[key]
        assert answer.is_error and answer.content[0].text.startswith("invalid arguments: "), key
        assert text in answer.content[0].text, (key, answer.content[0].text)
    # Nothing reached the agents.
    assert not [r for r in takes.agent.requests if r.http_method == "POST"]
    assert not [r for r in plain.agent.requests if r.http_method == "POST"]
