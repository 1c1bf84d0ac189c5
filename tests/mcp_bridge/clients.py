"""The official MCP Python SDK client, as an MCP application would use it against ``/mcp``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

T = TypeVar("T")


async def with_client(base_url: str, token: str | None, use: Callable[[Client], Awaitable[T]],
                      *, mode: str = "auto", path: str = "/mcp", **options: Any) -> T:
    """Connect an SDK client to ``base_url``'s ``/mcp`` (or ``path``: a query string pinning
    a snapshot) with a bearer ``token`` (none: no Authorization header) and answer
    ``use(client)``. ``options``: more arguments of the SDK's ``Client`` (a
    ``message_handler``)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        transport = streamable_http_client(f"{base_url}{path}", http_client=http)
        async with Client(transport, mode=mode, **options) as client:
            return await use(client)


def run(base_url: str, token: str | None, use: Callable[[Client], Awaitable[T]],
        **kwargs: Any) -> T:
    """:func:`with_client` from a synchronous test (its own event loop)."""
    return asyncio.run(asyncio.wait_for(with_client(base_url, token, use, **kwargs), 120))


async def all_tools(client: Client) -> list:
    tools, cursor = [], None
    while True:
        page = await client.session.list_tools(cursor=cursor) if cursor else \
            await client.list_tools()
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools
