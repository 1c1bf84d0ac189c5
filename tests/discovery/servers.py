"""Real HTTP servers for discovery tests: a card server that speaks HTTP caching (ETag,
Cache-Control, 304) and counts requests, and a Kubernetes API stand-in answering recorded JSON.
Raw ASGI apps, served on loopback by ``tests.servers.serve_app``."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections import Counter
from typing import Any
from urllib.parse import parse_qs

WELL_KNOWN = "/.well-known/agent-card.json"


def make_card(name: str, endpoint: str, skills: list[dict[str, Any]], **extra: Any) -> dict:
    return {
        "name": name, "description": f"{name} (text from the card, never shown)",
        "url": endpoint, "version": "1.0.0", "protocolVersion": "0.3.0",
        "capabilities": {"streaming": False},
        "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"],
        "skills": skills, **extra,
    }


def skill(skill_id: str, *tags: str, **modes: Any) -> dict[str, Any]:
    return {"id": skill_id, "name": skill_id, "description": skill_id, "tags": list(tags),
            **modes}


#: Cards written the way their publishers would, for the tests of matching by meaning (needs
#: and tool lists described in words): none names what those tests ask for in the askers'
#: words (the money changer never says "euro" or "yen").
EVERYDAY_AGENTS: dict[str, tuple[str, str, list[tuple[str, str]]]] = {
    "money": ("Money Changer", "Converts amounts between the world's currencies at live "
              "foreign-exchange rates.",
              [("convert", "Convert an amount of money into another currency."),
               ("rates", "Today's and past exchange rates between two currencies.")]),
    "sky": ("Sky Watch", "Forecasts for any city: temperature, rain, snow and wind.",
            [("forecast", "Hourly and ten-day forecasts."),
             ("now", "Conditions outside right now.")]),
    "words": ("Polyglot", "Renders documents and messages in more than fifty languages.",
              [("render", "Render a text in another language, keeping its tone.")]),
    "trips": ("Fare Hunter", "Finds and books plane tickets between airports worldwide.",
              [("search", "Compare fares across airlines."), ("book", "Book a seat.")]),
    "ledger": ("Ledger", "Bookkeeping for small businesses: invoices, receipts, tax returns.",
               [("invoice", "Issue and chase invoices."), ("vat", "Prepare the VAT return.")]),
}


def everyday_card(name: str, endpoint: str) -> dict[str, Any]:
    """The card of :data:`EVERYDAY_AGENTS`' ``name`` served at ``endpoint``; its skills are
    tagged with the name."""
    title, description, skills = EVERYDAY_AGENTS[name]
    card = make_card(title, endpoint, [
        {"id": sid, "name": sid, "description": text, "tags": [name]} for sid, text in skills
    ])
    card["description"] = description
    return card


async def _body(receive) -> None:
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body"):
            return


async def _lifespan(receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class CardServer:
    """Cards by path prefix (``/a/<name>``): ``ETag`` is a hash of the bytes (or a new one on
    every response with ``volatile_etag``), ``If-None-Match`` answers 304, every request is
    counted per prefix. A prefix can be ``down`` (503), ``hang`` (sleeps), wait for its gate
(``gates``: a ``threading.Event``), or redirect."""

    def __init__(self, *, cache_control: str = "max-age=300") -> None:
        self.cards: dict[str, bytes] = {}
        self.counts: Counter[str] = Counter()
        self.statuses: Counter[tuple[str, int]] = Counter()
        self.cache_control: dict[str, str] = {}
        self.default_cache_control = cache_control
        self.down: set[str] = set()
        self.hang: dict[str, float] = {}
        # A prefix whose answers wait until its event is set (at most a minute): a test
        # releases them when it has seen what it waits for, however slow the machine.
        self.gates: dict[str, threading.Event] = {}
        self.redirects: dict[str, str] = {}
        self.volatile_etag: set[str] = set()
        self.delay = 0.0
        self.url = ""
        self._lock = threading.Lock()
        self._n = 0

    def base(self, prefix: str) -> str:
        return f"{self.url}{prefix}/"

    def set_card(self, prefix: str, card: dict[str, Any]) -> bytes:
        raw = json.dumps(card, sort_keys=True).encode()
        self.cards[prefix] = raw
        return raw

    def count(self, prefix: str) -> int:
        return self.counts[prefix]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        await _body(receive)
        path = scope["path"]
        prefix = path[: -len(WELL_KNOWN)] if path.endswith(WELL_KNOWN) else path
        with self._lock:
            self.counts[prefix] += 1
            self._n += 1
            n = self._n
        headers = dict((k.decode().lower(), v.decode()) for k, v in scope["headers"])
        if self.delay:
            await asyncio.sleep(self.delay)
        if prefix in self.hang:
            await asyncio.sleep(self.hang[prefix])
        if prefix in self.gates:
            await asyncio.to_thread(self.gates[prefix].wait, 60)
        if prefix in self.redirects:
            location = self.redirects[prefix].encode()
            await self._send(send, prefix, 302, b"", [(b"location", location)])
            return
        if prefix in self.down or prefix not in self.cards:
            await self._send(send, prefix, 503 if prefix in self.down else 404, b"{}")
            return
        raw = self.cards[prefix]
        etag = f'"{hashlib.sha256(raw).hexdigest()[:16]}"'
        if prefix in self.volatile_etag:
            etag = f'"v{n}"'
        cache = [(b"etag", etag.encode()),
                 (b"cache-control", self.cache_control.get(prefix, self.default_cache_control)
                  .encode())]
        if headers.get("if-none-match") == etag:
            await self._send(send, prefix, 304, b"", cache)
            return
        await self._send(send, prefix, 200, raw, [(b"content-type", b"application/json"), *cache])

    async def _send(self, send, prefix: str, status: int, body: bytes, headers=()) -> None:
        with self._lock:
            self.statuses[(prefix, status)] += 1
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", str(len(body)).encode()), *headers]})
        await send({"type": "http.response.body", "body": body})


def service(name: str, namespace: str, labels: dict[str, str], base_url: str | None = None,
            port: int = 8080) -> dict[str, Any]:
    """A Service object as the Kubernetes API returns it (recorded shape, trimmed)."""
    meta: dict[str, Any] = {
        "name": name, "namespace": namespace, "uid": hashlib.md5(name.encode()).hexdigest(),
        "resourceVersion": "4711", "creationTimestamp": "2025-01-01T10:00:00Z",
        "labels": labels,
    }
    if base_url:
        meta["annotations"] = {"a2a.dev/base-url": base_url}
    return {
        "metadata": meta,
        "spec": {"ports": [{"name": "http", "protocol": "TCP", "port": port,
                            "targetPort": port}],
                 "selector": {"app": name}, "clusterIP": "10.96.0.12", "type": "ClusterIP"},
        "status": {"loadBalancer": {}},
    }


class KubeApi:
    """Answers ``GET /api/v1/namespaces/{ns}/services`` and ``/api/v1/services`` with a
    ServiceList filtered by an equality ``labelSelector``, as the API server would."""

    def __init__(self) -> None:
        self.services: list[dict[str, Any]] = []
        self.requests: list[str] = []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        await _body(receive)
        path = scope["path"]
        query = parse_qs(scope["query_string"].decode())
        self.requests.append(path)
        parts = path.strip("/").split("/")
        namespace = parts[3] if len(parts) == 5 and parts[2] == "namespaces" else None
        if not (path == "/api/v1/services" or (namespace and parts[4] == "services")):
            body, status = json.dumps({"kind": "Status", "code": 404}).encode(), 404
        else:
            wanted = dict(
                term.split("=", 1) for term in (query.get("labelSelector") or [""])[0].split(",")
                if "=" in term
            )
            items = [
                s for s in self.services
                if (namespace is None or s["metadata"]["namespace"] == namespace)
                and all(s["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
            ]
            body = json.dumps({"kind": "ServiceList", "apiVersion": "v1",
                               "metadata": {"resourceVersion": "4712"}, "items": items}).encode()
            status = 200
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
