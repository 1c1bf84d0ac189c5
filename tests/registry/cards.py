"""Sample cards of the three accepted shapes."""

from __future__ import annotations

import copy


def card_03(url: str = "http://127.0.0.1:9/", *, tags=("echo", "test"), name="Echo Agent") -> dict:
    return {
        "name": name,
        "description": "Echoes what it is sent.",
        "url": url,
        "version": "1.0.0",
        "protocolVersion": "0.3.0",
        "preferredTransport": "JSONRPC",
        "capabilities": {"streaming": True},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": [{"id": "echo", "name": "Echo", "description": "Echo back", "tags": list(tags)}],
    }


def card_10(url: str = "http://127.0.0.1:9/a2a", *, tags=("warranty",)) -> dict:
    return {
        "name": "Warranty Agent",
        "description": "Warranty claims.",
        "version": "2.0.0",
        "supportedInterfaces": [
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            {
                "url": url.replace("/a2a", "/rest"),
                "protocolBinding": "HTTP+JSON",
                "protocolVersion": "1.0",
            },
        ],
        "capabilities": {"streaming": True},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["application/json"],
        "skills": [
            {
                "id": "claims",
                "name": "Claims",
                "description": "File a claim",
                "tags": list(tags),
                "inputModes": ["text/plain", "image/png"],
            }
        ],
    }


def card_kubemq(agent_id: str = "echo-agent-01", url: str = "http://127.0.0.1:9/") -> dict:
    return {
        "agent_id": agent_id,
        "name": "Echo Agent",
        "description": "A simple echo agent for testing",
        "version": "1.0.0",
        "url": url,
        "skills": [
            {"id": "echo", "name": "Echo", "description": "Echoes", "tags": ["test", "echo"]}
        ],
        "defaultInputModes": ["text"],
        "defaultOutputModes": ["text"],
        "protocolVersions": ["1.0"],
    }


def clone(card: dict) -> dict:
    return copy.deepcopy(card)
