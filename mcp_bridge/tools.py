"""The MCP tools of the registry: one tool per routable agent a caller may call.

**One tool per agent, not per skill.** An A2A agent takes one message and decides itself which
skill answers it: a skill has no endpoint, no arguments and no way to be addressed in a
``SendMessage``. Tools per skill would promise a routing the agent does not offer (and multiply
the tool list an MCP client hands its model); the skills are listed in the tool's description
instead.

**Name = agent id.** Agent ids (2-63 of ``a-z``, ``0-9``, ``-``) are already valid MCP tool
names and stable across restarts and nodes, so a tool call is routed from its name alone,
without a lookup. Agent ids contain no ``_``: :data:`GET_TASK` never collides with one.

**Descriptions.** Card text is written by whoever runs the agent and reaches the MCP client's
model as instructions: an injection surface. Where an operator reviewed a description (the
discovery configuration's ``description`` of a static or probed agent, or of the need a
discovered agent satisfies, as published in the current discovery snapshot), that text is the
tool's description and the card's text is not used. Elsewhere the card's description and skills
are used, unless ``A2A_MCP_CARD_DESCRIPTIONS`` is off: then only the agent's id and card name.

**Filtered by a text.** ``/mcp?q=<text>`` lists only the tools whose agents ARD's ranker (the
one ``POST /ard/v1/search`` uses: words and meaning fused) scores at or above
``A2A_MCP_QUERY_MIN_SCORE`` for the text, best first (:func:`routes_ranked`); ``get_task`` stays.
It narrows the list a client hands its model; it is no permission: every tool the caller may
call can still be called.

The list comes from the node's in-memory routing table (what is routable now) filtered by the
caller's scopes; each tool is built once per card version (keyed by the route's card hash) from
the stored card, read from the database on a miss, together with the other misses of the page.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import orjson
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import DatabaseError, close_old_connections

from ard.selectors import agents_ranked
from core import outage, threads
from discovery.snapshots import snapshots_current
from registry.cards import SHAPE_A2A_10, card_shape
from registry.events import AgentRoute
from registry.ids import agent_key
from registry.permissions import Actor
from registry.selectors import agent_cards

logger = logging.getLogger(__name__)

GET_TASK = "get_task"
#: Tools per tools/list page.
PAGE_SIZE = 200
#: Longest description and title kept from a card (characters).
MAX_DESCRIPTION = 2000
MAX_TITLE = 100
#: Tools built from cards kept in memory (per card version).
MAX_CACHED = 4096

MESSAGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "message": {"type": "string", "description": "The text sent to the agent."},
        "context_id": {
            "type": "string",
            "description": "Continue the conversation with this context id (from an earlier "
                           "call's result).",
        },
        "task_id": {
            "type": "string",
            "description": "Continue this task (one the agent left waiting for input).",
        },
    },
    "required": ["message"],
    "additionalProperties": False,
}
DATA_PROPERTY: dict[str, Any] = {
    "type": "object",
    "description": "Structured data sent beside the text as a data part.",
}
#: Media types a card lists that are not files: the message text, and JSON (the data part).
_NOT_FILES = {"text", "text/plain", "data"}
#: A card's media types listed in a tool's schema (at most).
MAX_MODES = 20


def files_property(modes: tuple[str, ...]) -> dict[str, Any]:
    """The ``files`` argument of an agent whose input modes take ``modes`` (sent as file
    parts: mcp_bridge.calls)."""
    return {
        "type": "array",
        "description": "Files sent beside the text as file parts, each with its bytes "
                       "(base64 `data`) or a `uri` the agent can fetch. Media types the agent "
                       "takes: " + ", ".join(modes) + ".",
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "The file name."},
                "mimeType": {"type": "string", "description": "The file's media type."},
                "data": {"type": "string", "contentEncoding": "base64",
                         "description": "The file's bytes, base64-encoded."},
                "uri": {"type": "string", "description": "An http(s) URL of the file."},
            },
            "required": ["mimeType"],
            "additionalProperties": False,
        },
    }
GET_TASK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "agent_id": {"type": "string", "description": "The agent (tool name) that runs the task."},
        "task_id": {"type": "string", "description": "The task id an earlier call returned."},
    },
    "required": ["agent_id", "task_id"],
    "additionalProperties": False,
}
GET_TASK_DESCRIPTION = (
    "The current state and results of a task an agent is still working on: pass the agent_id "
    "and task_id an earlier tool call returned."
)


class Unavailable(Exception):
    """A card needed now is not in memory and the database cannot be read; ``found``: the
    tools that were in memory."""

    def __init__(self, message: str, found: dict[str, AgentTool] | None = None) -> None:
        super().__init__(message)
        self.found = found or {}


@dataclass(frozen=True)
class AgentTool:
    """What the bridge knows of an agent's card: enough to list it and to call it."""

    agent_id: str
    card_sha256: str
    title: str
    card_description: str  # from the card: name, description, skills
    protocol: str  # "1.0" (SendMessage, A2A-Version: 1.0) or "0.3" (message/send)
    accepts_data: bool  # the card's input modes take JSON
    streaming: bool = False  # the card's capabilities.streaming: calls stream, with progress
    file_modes: tuple[str, ...] = ()  # the card's input modes that are files (image/png, */*)

    def input_schema(self) -> dict[str, Any]:
        if not self.accepts_data and not self.file_modes:
            return MESSAGE_SCHEMA
        properties = dict(MESSAGE_SCHEMA["properties"])
        if self.accepts_data:
            properties["data"] = DATA_PROPERTY
        if self.file_modes:
            properties["files"] = files_property(self.file_modes)
        return {**MESSAGE_SCHEMA, "properties": properties}


_cache: dict[tuple[str, str], AgentTool] = {}


def _as_dict(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one (agents' replies are untrusted)."""
    return value if isinstance(value, dict) else {}


def _text(value: Any, limit: int) -> str:
    return " ".join(value.split())[:limit] if isinstance(value, str) else ""


def tool_from_card(agent_id: str, sha: str, raw: str) -> AgentTool:
    try:
        card = orjson.loads(raw)
    except orjson.JSONDecodeError:
        card = {}
    if not isinstance(card, dict):
        card = {}
    title = _text(card.get("name"), MAX_TITLE) or agent_id
    lines = [_text(card.get("description"), MAX_DESCRIPTION)]
    skills = [s for s in card.get("skills") or [] if isinstance(s, dict)]
    if skills:
        lines.append("Skills: " + "; ".join(
            f"{_text(s.get('name'), MAX_TITLE) or _text(s.get('id'), MAX_TITLE)}"
            + (f" -- {_text(s.get('description'), 300)}" if s.get("description") else "")
            for s in skills[:20]))
    capabilities = _as_dict(card.get("capabilities"))
    # What the agent takes: its default input modes and any skill's own.
    modes = {m.strip().lower() for m in [
        *(card.get("defaultInputModes") or []),
        *(m for s in skills if isinstance(s.get("inputModes"), list) for m in s["inputModes"])]
        if isinstance(m, str) and m.strip()}
    accepts_data = any("json" in m or m == "data" for m in modes)
    file_modes = tuple(sorted(m[:MAX_TITLE] for m in modes
                              if m not in _NOT_FILES and "json" not in m))[:MAX_MODES]
    return AgentTool(
        agent_id=agent_id, card_sha256=sha, title=title,
        card_description="\n".join(line for line in lines if line)[:MAX_DESCRIPTION],
        protocol="1.0" if card_shape(card) == SHAPE_A2A_10 else "0.3",
        accepts_data=accepts_data,
        streaming=capabilities.get("streaming") is True,
        file_modes=file_modes,
    )


def _load(routes: list[AgentRoute]) -> dict[str, AgentTool]:
    """Tools of ``routes`` from the stored cards (one query for all cache misses)."""
    found: dict[str, AgentTool] = {}
    missing = []
    for route in routes:
        tool = _cache.get((route.agent_id, route.card_sha256))
        if tool is None:
            missing.append(route.agent_id)
        else:
            found[route.agent_id] = tool
    if missing:
        unavailable = "the registry database cannot be read now: retry shortly"
        if outage.breaker.is_open:  # known down: no wait for a connection that cannot come
            raise Unavailable(unavailable, found)
        try:
            cards = agent_cards(agent_ids=missing)
        except DatabaseError as exc:
            if outage.is_database_outage(exc):
                outage.breaker.trip(exc)
            raise Unavailable(unavailable, found) from exc
        if len(_cache) + len(missing) > MAX_CACHED:
            _cache.clear()
        for agent_id, (sha, raw) in cards.items():
            tool = _cache[(agent_id, sha)] = tool_from_card(agent_id, sha, raw)
            found[agent_id] = tool
    return found


#: The reviewed descriptions last read (used while the database cannot be read).
_reviewed: dict[str, str] | None = None


def _reviewed_descriptions() -> dict[str, str] | None:
    """``routing key -> description`` of every tenant's current discovery snapshot
    (operator-reviewed); the last ones read when the database cannot be read now, None when
    none were ever read."""
    global _reviewed
    if outage.breaker.is_open:
        return _reviewed
    try:
        current = snapshots_current()
    except DatabaseError as exc:
        logger.warning("reviewed tool descriptions not read: the database is unavailable")
        if outage.is_database_outage(exc):
            outage.breaker.trip(exc)
        return _reviewed
    _reviewed = {
        agent_key(str(snapshot.tenant_id), row["agent_id"]): row["description"]
        for snapshot in current for row in snapshot.agents
        if isinstance(row, dict) and row.get("agent_id") and row.get("description")}
    return _reviewed


def _description(tool: AgentTool, reviewed: dict[str, str] | None) -> str:
    """The reviewed description, else the card's (when allowed). Unknown whether one was
    reviewed (never read, database down): never the card's text."""
    if reviewed is not None and reviewed.get(tool.agent_id):
        return reviewed[tool.agent_id][:MAX_DESCRIPTION]
    if reviewed is not None and settings.A2A_MCP_CARD_DESCRIPTIONS and tool.card_description:
        return tool.card_description
    return f"The A2A agent {tool.agent_id} ({tool.title})."


def callable_routes(table_routes: list[AgentRoute], actor: Actor) -> list[AgentRoute]:
    """The routes ``actor`` may call as tools, by agent id. Agents with credential passthrough
    are left out: their callers send the agent's own credential in ``Authorization``, which an
    MCP client uses for the registry's token."""
    return sorted((r for r in table_routes
                   if not r.credential_passthrough and actor.may_call(r.agent_id, r)),
                  key=lambda r: r.agent_id)


#: Begins the cursor of a ranked list (an offset: the ranking has no key to resume after);
#: never the first character of an agent id.
RANKED_CURSOR = "#"
#: Threads ranking tools for ``?q=`` on a node.
SEARCH_WORKERS = 2


def page(routes: list[AgentRoute], cursor: str | None, *, ranked: bool = False
         ) -> tuple[list[AgentRoute], str | None]:
    """One page of routes after ``cursor`` and the next page's cursor: an agent id for
    ``routes`` by agent id, an offset for ``ranked`` ones (in rank order)."""
    if ranked:
        digits = (cursor or "").removeprefix(RANKED_CURSOR)
        start = int(digits) if cursor and cursor.startswith(RANKED_CURSOR) \
            and digits.isdigit() else 0
        chunk = routes[start:start + PAGE_SIZE]
        following = start + PAGE_SIZE
        return chunk, (f"{RANKED_CURSOR}{following}" if len(routes) > following else None)
    if cursor:
        routes = [r for r in routes if r.agent_id > cursor]
    chunk = routes[:PAGE_SIZE]
    return chunk, (chunk[-1].agent_id if len(routes) > PAGE_SIZE else None)


async def routes_ranked(routes: list[AgentRoute], text: str) -> list[AgentRoute]:
    """The ``routes`` whose agents the search index's ranker scores at least
    ``A2A_MCP_QUERY_MIN_SCORE`` for ``text``, best first. Raises :class:`Unavailable` when
    the index cannot be read. On threads of its own (``mcp-search``): the ranking may wait
    for this node's deferred search documents, never on the thread Django's views share."""
    return await asyncio.get_running_loop().run_in_executor(
        threads.pool("mcp-search", SEARCH_WORKERS), _routes_ranked, routes, text
    )


def _routes_ranked(routes: list[AgentRoute], text: str) -> list[AgentRoute]:
    close_old_connections()
    try:
        return _ranked(routes, text)
    finally:
        close_old_connections()


def _ranked(routes: list[AgentRoute], text: str) -> list[AgentRoute]:
    by_id = {r.agent_id: r for r in routes}
    unavailable = "the search index cannot be read now: list without ?q=, or retry shortly"
    if outage.breaker.is_open:
        raise Unavailable(unavailable)
    try:
        ranked = agents_ranked(text=text, agent_ids=list(by_id))
    except DatabaseError as exc:
        if outage.is_database_outage(exc):
            outage.breaker.trip(exc)
        raise Unavailable(unavailable) from exc
    floor = settings.A2A_MCP_QUERY_MIN_SCORE
    return [by_id[agent_id] for agent_id, score in ranked if score >= floor]


@database_sync_to_async
def tools_listed(routes: list[AgentRoute],
                 reviewed: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Tool definitions (MCP ``Tool`` fields) of ``routes``, in order, with the reviewed
    descriptions of a pinned snapshot (``reviewed``), else of the current one. While the
    database cannot be read, an agent whose card this node never read is listed by its id
    alone (calling it answers ``registry_unavailable`` until the card can be read)."""
    unread = False
    try:
        tools = _load(routes)
    except Unavailable as exc:
        tools, unread = exc.found, True
    if reviewed is None:
        reviewed = _reviewed_descriptions()
    listed = []
    for route in routes:
        tool = tools.get(route.agent_id)
        if tool is None and unread:
            listed.append({"name": route.agent_id, "title": route.agent_id,
                           "description": f"The A2A agent {route.agent_id}.",
                           "input_schema": MESSAGE_SCHEMA})
            continue
        if tool is None:  # deregistered since the table was read
            continue
        listed.append({
            "name": tool.agent_id,
            "title": tool.title,
            "description": _description(tool, reviewed),
            "input_schema": tool.input_schema(),
        })
    return listed


async def tool_of(route: AgentRoute) -> AgentTool | None:
    """The tool of a route: from memory, or its stored card on the first call on this node."""
    tool = _cache.get((route.agent_id, route.card_sha256))
    if tool is not None:
        return tool
    return (await database_sync_to_async(_load)([route])).get(route.agent_id)
