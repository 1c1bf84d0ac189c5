"""Fast node-death detection: a Redis liveness key per node, and a watcher of the peers' keys.

Every serving node (distributed mode) refreshes ``a2a:node:{cluster}:alive:{node_id}`` every
``A2A_NODE_LIVENESS_REFRESH_SECONDS`` with a TTL of ``A2A_NODE_LIVENESS_TTL_SECONDS`` (value:
this process's token and its state, ``up`` or ``stopping``) and adds its id to the set
``a2a:node:{cluster}:known``. ``{cluster}`` names the registry database (``core.cluster``):
nodes sharing a Redis but not a database are separate clusters and never adopt each other's
agents. On the same beat it reads every known node's key: a peer whose key it saw
before and that is now gone (killed, frozen, cut off from Redis for longer than the TTL), or
whose token changed (restarted within the TTL), is reported dead to the node at once
(:meth:`gateway.runtime.GatewayNode.peer_dead`). A node that stops cleanly deletes its key
last, so its peers need not wait for the TTL.

The beat runs in a thread of its own with its own Redis connection: a busy event loop neither
delays the refresh (which would make a loaded node look dead) nor the detection. The database
node heartbeat (``A2A_NODE_HEARTBEAT_SECONDS``) is kept for the admin and the expiry job.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from core import threads

if TYPE_CHECKING:
    import redis

logger = logging.getLogger(__name__)

KEY_PREFIX = "a2a:node:{cluster}:alive:"
KNOWN_SET = "a2a:node:{cluster}:known"


#: What ends a call in flight on a node found dead (pushed into the call's reply buffer,
#: gateway.relays).
OWNER_LOST: dict[str, str] = {"k": "owner_lost"}
#: What ends every call in flight through the broker when this node's subscribing connection to
#: it is lost: replies published meanwhile are gone (gateway.runtime, gateway.relays).
BROKER_LOST: dict[str, str] = {"k": "broker_lost"}
#: A known node whose key has been gone this many TTLs is dropped from the known set.
FORGET_AFTER_TTLS = 20


class Liveness:
    """The liveness beat of one node (a thread): refreshes its key, watches the peers'."""

    def __init__(self, url: str, node_id: str, *, cluster: str, refresh: float, ttl: float,
                 on_dead: Callable[[str, bool], None]) -> None:
        """``on_dead(node_id, restarted)`` is called from the beat's thread for each peer found
        dead (``restarted``: a new process already took its id, so only its old calls are lost)."""
        self.url = url
        self.node_id = node_id
        self.prefix = KEY_PREFIX.format(cluster=cluster)
        self.known = KNOWN_SET.format(cluster=cluster)
        self.refresh = refresh
        self.ttl = ttl
        self.on_dead = on_dead
        self.token = uuid.uuid4().hex[:16]
        self.state = "up"
        #: Peers (not this node) whose key is present, with their state ("up" / "stopping").
        self.peers: dict[str, str] = {}
        #: Peers found dead and not back since (calls to them are answered at once).
        self.dead: frozenset[str] = frozenset()
        self._tokens: dict[str, str] = {}
        self._gone_since: dict[str, float] = {}
        self._stop = threading.Event()
        self._beating = threading.Lock()  # the beat's thread and stopping() both beat
        self._thread: threading.Thread | None = None
        self._client: redis.Redis | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        import redis

        self._client = redis.Redis.from_url(self.url, socket_timeout=max(self.ttl / 2, 0.5),
                                            socket_connect_timeout=max(self.ttl / 2, 0.5))
        try:
            self.beat()  # the first beat at once: peers and this node's key known before serving
        except Exception as exc:
            logger.warning("node liveness: first beat failed: %s: %s", type(exc).__name__, exc)
        self._thread = threads.start("a2a-node-liveness", self._run)

    def stopping(self) -> None:
        """Announce that this node is stopping: peers no longer hand agents to it."""
        self.state = "stopping"
        try:
            self.beat()  # and a fresh look at the peers: the handover's targets
        except Exception as exc:
            logger.warning("node liveness: %s: %s", type(exc).__name__, exc)

    def stop(self) -> None:
        """Stop the beat and delete this node's key (peers see the node gone at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.refresh + 1)
        if self._client is not None:
            try:
                self._client.delete(self.prefix + self.node_id)
            except Exception:
                pass  # the key expires on its own
            self._client.close()

    def live_nodes(self) -> list[str]:
        """Nodes that can take agents: this one (unless stopping) and the peers that are up."""
        nodes = [n for n, state in self.peers.items() if state == "up"]
        if self.state == "up":
            nodes.append(self.node_id)
        return sorted(nodes)

    def is_alive(self, node_id: str) -> bool:
        return node_id == self.node_id or node_id in self.peers

    # --- the beat --------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.refresh):
            try:
                self.beat()
            except Exception as exc:  # Redis unreachable: keep trying; peers judge by the TTL
                logger.warning("node liveness beat failed: %s: %s", type(exc).__name__, exc)

    def _write(self) -> None:
        assert self._client is not None  # started
        pipe = self._client.pipeline(transaction=False)
        pipe.set(self.prefix + self.node_id, f"{self.token}:{self.state}",
                 px=max(int(self.ttl * 1000), 1))
        pipe.sadd(self.known, self.node_id)
        pipe.execute()

    def beat(self) -> None:
        """One refresh and one look at the peers (the thread's loop, and stopping())."""
        with self._beating:
            self._beat()

    def _beat(self) -> None:
        self._write()
        assert self._client is not None  # started
        known = sorted(m.decode() for m in self._client.smembers(self.known))  # type: ignore[union-attr]  # bytes replies
        others = [n for n in known if n != self.node_id]
        values = self._client.mget([self.prefix + n for n in others]) if others else []
        now = time.monotonic()
        peers: dict[str, str] = {}
        dead: list[tuple[str, bool]] = []
        for node_id, value in zip(others, values, strict=True):
            if value is None:
                if node_id in self._tokens:
                    del self._tokens[node_id]
                    dead.append((node_id, False))
                since = self._gone_since.setdefault(node_id, now)
                if now - since > FORGET_AFTER_TTLS * self.ttl:
                    self._client.srem(self.known, node_id)
                    self._gone_since.pop(node_id, None)
                continue
            self._gone_since.pop(node_id, None)
            token, _, state = value.decode().partition(":")  # type: ignore[union-attr]  # bytes replies
            previous = self._tokens.get(node_id)
            if previous is not None and previous != token:
                dead.append((node_id, True))  # restarted within the TTL: its old process is gone
            self._tokens[node_id] = token
            peers[node_id] = state or "up"
        self.peers = peers
        gone = {node_id for node_id, restarted in dead if not restarted}
        if gone or (self.dead & peers.keys()):
            self.dead = frozenset((self.dead | gone) - peers.keys())
        for node_id, restarted in dead:
            logger.warning("node %s is gone (liveness key %s)", node_id,
                           "replaced: restarted" if restarted else "expired or deleted")
            try:
                self.on_dead(node_id, restarted)
            except Exception:
                logger.exception("node liveness: handling the death of %s failed", node_id)
