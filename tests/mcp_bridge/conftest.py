"""MCP bridge fixtures: the gateway's (SDK echo agents registered on the live platform,
callers with their own tokens) and an official MCP SDK client against ``/mcp``."""

from __future__ import annotations

from tests.gateway.conftest import (  # noqa: F401  (pytest fixtures)
    caller,
    echo_agent,
    echo_agent_factory,
    make_caller,
    register_agent,
)
