"""What a translating binding (gRPC; HTTP+JSON for an agent without an HTTP+JSON interface)
needs to know of an agent beyond its route: the A2A version its JSON-RPC endpoint speaks (calls
are translated to it) and its own gRPC interfaces.

Read from the agent's stored card once per card (the route's ``card_sha256`` names it: a new
card is read again) and kept in memory; the hot path reads a dict. A miss reads the database
in a worker thread, as the MCP bridge reads cards for its tools.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from channels.db import database_sync_to_async

from registry.bindings import grpc_endpoint, grpc_tenant, jsonrpc_version
from registry.events import AgentRoute
from registry.selectors import agent_cards

MAX_CACHED = 4096


@dataclass(frozen=True, slots=True)
class AgentBindings:
    """``jsonrpc``: the version of the agent's JSON-RPC (``"1.0"`` or ``"0.3"``); ``grpc``:
    its own gRPC interface (``host:port``) per protocol version, "" when it lists none;
    ``grpc_tenant``: the ``tenant`` its 1.x gRPC interface names ("" when none)."""

    jsonrpc: str
    grpc_v10: str = ""
    grpc_v03: str = ""
    grpc_tenant: str = ""

    def grpc(self, version: str) -> str:
        return self.grpc_v10 if version == "1.0" else self.grpc_v03


_cache: dict[tuple[str, str], AgentBindings] = {}


def of_card(card: object, endpoint: str) -> AgentBindings:
    if not isinstance(card, dict):
        return AgentBindings("0.3")
    return AgentBindings(jsonrpc_version(card, endpoint), grpc_endpoint(card, "1.0"),
                         grpc_endpoint(card, "0.3"), grpc_tenant(card))


def _read(agent_id: str) -> tuple[str, str] | None:
    return agent_cards(agent_ids=[agent_id]).get(agent_id)


async def bindings(route: AgentRoute) -> AgentBindings:
    """The agent's bindings, from its current card. Raises the database's error when the card
    cannot be read now (the caller answers ``unavailable``)."""
    key = (route.agent_id, route.card_sha256)
    found = _cache.get(key)
    if found is not None:
        return found
    row = await database_sync_to_async(_read, thread_sensitive=False)(route.agent_id)
    card: object = None
    if row is not None:
        try:
            card = orjson.loads(row[1])
        except orjson.JSONDecodeError:
            card = None
    found = of_card(card, route.endpoint)
    if row is not None and row[0] == route.card_sha256:
        if len(_cache) >= MAX_CACHED:
            _cache.clear()
        _cache[key] = found
    return found
