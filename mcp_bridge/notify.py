"""``notifications/tools/list_changed`` for open MCP sessions, on whichever node holds them.

The server keeps no session (:mod:`mcp_bridge.server`): what a session needs to receive change
notifications travels with it, so any node serves its stream.

- **Handshake era** (2025 protocol versions): ``initialize`` is answered with an
  ``Mcp-Session-Id`` that is self-contained -- signed with ``SECRET_KEY`` (the same on every
  node), carrying the client id it was issued to and the URL's pin (``?session=`` /
  ``?snapshot=``), nothing secret -- and the client's ``GET /mcp`` with that id (the standalone
  SSE stream) may reach any node, which then sends the notifications on it. POSTs ignore the
  id, as before.
- **2026-07-28**: the client's ``subscriptions/listen`` request (a POST whose response is the
  stream) reaches any node; :func:`listen` serves it.

Every node applies every registry change to its routing table (events from any node, resyncs as
the safety net): the node holding a stream watches its own table (:meth:`RoutingTable.watch`)
and tells the stream when an agent its caller may see -- callable by the token, in the pinned
snapshot if the session is pinned -- appeared, went away (deregistered, expired) or changed its
card or its reach (visibility, ``shared_with``). The notifier keeps what each tool showed and
who could see it (:class:`Shown`), so an agent published to other tenants that goes away or is
unpublished is told to every listener who could see it before, not only to its tenant's.
Notifications are level triggers ("list again"): a stream that has one pending does not
queue another, so a burst of changes is one notification and a slow reader holds no backlog.

Bounds: streams per node (``A2A_MCP_MAX_STREAMS``) and per client
(``A2A_MCP_MAX_STREAMS_PER_CLIENT``); a keepalive comment every ``A2A_MCP_KEEPALIVE_SECONDS``,
which is also when the caller's token is checked again (a revoked token ends its streams within
the token cache's delay; a token whose allowed agents changed gets a notification); a write
that a client does not take within ``A2A_MCP_KEEPALIVE_SECONDS`` ends the stream. A draining
node ends its streams, so clients reconnect to another node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core import signing

from core import lifecycle as node_config
from registry.permissions import Actor
from registry.token_cache import AuthFailed, AuthUnavailable

logger = logging.getLogger(__name__)

_SALT = "a2a.mcp.session"
#: How often an open stream checks whether its node is draining.
DRAIN_POLL_SECONDS = 0.5

LIST_CHANGED = (b'event: message\ndata: {"jsonrpc":"2.0",'
                b'"method":"notifications/tools/list_changed"}\n\n')
KEEPALIVE = b": keepalive\n\n"


# --- session ids ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Session:
    """What an ``Mcp-Session-Id`` says: the client it was issued to and the URL's pin."""

    client_id: str
    pin: tuple[str, str] | None  # ("session", id) or ("snapshot", digest)


def issue(client_id: str, pin: tuple[str, str] | None) -> str:
    """A new session id (visible ASCII, as the transport requires): signed, not encrypted --
    it carries nothing the client does not know."""
    return signing.dumps({"c": client_id, "p": list(pin) if pin else None,
                          "n": secrets.token_hex(6)}, salt=_SALT)


def read(value: str | None) -> Session | None:
    """The session a header names, or None (absent, not issued by this installation)."""
    if not value:
        return None
    try:
        data = signing.loads(value, salt=_SALT)
    except signing.BadSignature:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("c"), str):
        return None
    pin = data.get("p")
    if not (isinstance(pin, list) and len(pin) == 2 and all(isinstance(p, str) for p in pin)):
        pin = None
    return Session(client_id=data["c"], pin=(pin[0], pin[1]) if pin else None)


# --- streams -------------------------------------------------------------------------------


class Full(Exception):
    """No room for another stream; ``per_client``: the caller's own limit (else the node's)."""

    def __init__(self, message: str, *, per_client: bool) -> None:
        super().__init__(message)
        self.per_client = per_client


@dataclass(eq=False)
class Listener:
    """One open stream: whose it is and what it may see."""

    actor: Actor
    authorization: str | None
    pinned: frozenset[str] | None  # the pinned snapshot's agents (None: not pinned)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    changed: bool = False
    ended: str | None = None  # why the stream ends (revoked, draining, node stopping)
    unwatch: Callable[[], None] = lambda: None

    def sees(self, agent_id: str, route: Any = None) -> bool:
        """``route``: the agent's route, or what the notifier kept of it (:class:`Shown`);
        None: only its tenant's callers and platform admins see it."""
        return self.actor.may_call(agent_id, route) and (
            self.pinned is None or agent_id in self.pinned)

    def notify(self) -> None:
        self.changed = True
        self.wake.set()

    def end(self, why: str) -> None:
        self.ended = self.ended or why
        self.wake.set()


@dataclass(frozen=True)
class Shown:
    """What of a route a tool shows (its card version, whether credentials pass through) and
    who may see it (registry.permissions.Reachable: tenant, visibility, shared_with)."""

    card_sha256: str
    credential_passthrough: bool
    tenant: str
    visibility: str
    shared_with: tuple[str, ...]


def _key(route: Any) -> Shown | None:
    return None if route is None else Shown(
        route.card_sha256, route.credential_passthrough, route.tenant, route.visibility,
        tuple(route.shared_with))


class Notifier:
    """This process's open streams and the routing-table watch that feeds them (attached to the
    node's table while a stream is open)."""

    def __init__(self) -> None:
        self.listeners: set[Listener] = set()
        self._per_client: Counter[str] = Counter()
        self._node: Any = None
        self._unwatch: Callable[[], None] | None = None
        self._keys: dict[str, Shown] = {}  # agent (routing key) -> what its tool showed
        self._drain_watch: asyncio.Task | None = None

    def open(self, node: Any, actor: Actor, authorization: str | None,
             pinned: frozenset[str] | None) -> Listener:
        """Register a stream; raises :class:`Full`."""
        if len(self.listeners) >= settings.A2A_MCP_MAX_STREAMS:
            raise Full(f"this node holds {settings.A2A_MCP_MAX_STREAMS} notification streams "
                       "(A2A_MCP_MAX_STREAMS): retry later, or on another node", per_client=False)
        if self._per_client[actor.client_id] >= settings.A2A_MCP_MAX_STREAMS_PER_CLIENT:
            raise Full(f"this client holds {settings.A2A_MCP_MAX_STREAMS_PER_CLIENT} notification "
                       "streams on this node (A2A_MCP_MAX_STREAMS_PER_CLIENT): close one first",
                       per_client=True)
        self._attach(node)
        listener = Listener(actor, authorization, pinned)
        listener.unwatch = node.tokens.watch_client(actor.client_id,
                                                    lambda: listener.end("revoked"))
        self.listeners.add(listener)
        self._per_client[actor.client_id] += 1
        watch, loop = self._drain_watch, asyncio.get_running_loop()
        if watch is None or watch.done() or watch.get_loop() is not loop:
            self._drain_watch = loop.create_task(self._watch_drain(),
                                                 name="mcp-streams-drain-watch")
        return listener

    def close(self, listener: Listener) -> None:
        if listener not in self.listeners:
            return
        self.listeners.discard(listener)
        listener.unwatch()
        client_id = listener.actor.client_id
        self._per_client[client_id] -= 1
        if self._per_client[client_id] <= 0:
            del self._per_client[client_id]
        if not self.listeners:
            self._detach()

    def end_all(self, why: str) -> None:
        for listener in list(self.listeners):
            listener.end(why)

    def _attach(self, node: Any) -> None:
        if self._node is node and self._unwatch is not None:
            return
        self._detach()
        self._keys = {route.agent_id: key for route in node.table.routes()
                      if (key := _key(route)) is not None}
        self._unwatch = node.table.watch(self._on_change)
        self._node = node

    def _detach(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
        self._unwatch, self._node, self._keys = None, None, {}

    def _on_change(self, agent_ids: set[str]) -> None:
        """The routing table changed (node's loop): wake the streams that see a changed tool,
        now or before the change (an agent gone or unpublished is news to whoever saw it).
        Route changes a tool does not show (an agent moving between nodes) are ignored."""
        table = self._node.table
        changed: list[tuple[str, Shown | None, Shown | None]] = []
        for agent_id in agent_ids:
            key, before = _key(table.get(agent_id)), self._keys.get(agent_id)
            if before != key:
                changed.append((agent_id, before, key))
                if key is None:
                    self._keys.pop(agent_id, None)
                else:
                    self._keys[agent_id] = key
        if not changed:
            return
        for listener in self.listeners:
            if not listener.changed and any(
                    (now is not None and listener.sees(agent_id, now))
                    or (before is not None and listener.sees(agent_id, before))
                    for agent_id, before, now in changed):
                listener.notify()

    async def _watch_drain(self) -> None:
        while self.listeners:
            await asyncio.sleep(DRAIN_POLL_SECONDS)
            if node_config.draining():
                self.end_all("the node is stopping: reconnect")

    async def run(self, listener: Listener, tokens: Any,
                  write: Callable[[bytes | None], Awaitable[None]]) -> None:
        """Serve ``listener`` until it ends: ``write(LIST_CHANGED)`` on a change,
        ``write(None)`` each keepalive (the token checked again then). Raises TimeoutError when
        the client does not take a write within the keepalive period."""
        keepalive = settings.A2A_MCP_KEEPALIVE_SECONDS
        while listener.ended is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(keepalive):
                    await listener.wake.wait()
            listener.wake.clear()
            if listener.ended is not None:
                return
            if not listener.changed:  # keepalive: check the token again
                try:
                    actor = await tokens.actor(listener.authorization)
                except AuthUnavailable:
                    actor = listener.actor  # cannot check now: keep the stream
                except AuthFailed:
                    return
                if actor is None:
                    return
                if actor != listener.actor:  # scopes or allowed agents changed
                    listener.actor = actor
                    listener.changed = True
            async with asyncio.timeout(keepalive):
                if listener.changed:
                    listener.changed = False
                    await write(LIST_CHANGED)
                else:
                    await write(None)


notifier = Notifier()
