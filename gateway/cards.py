"""``GET /a2a/{agent_id}/.well-known/agent-card.json``: the agent's card, pointed at the gateway.

The card lists only the interfaces the gateway answers for the agent, each at this gateway's
``/a2a/{agent_id}/`` (``url``, ``supportedInterfaces``, ``additionalInterfaces`` alike;
:func:`registry.bindings.rewrite_card_endpoints`), so a stock A2A client given the gateway URL
keeps going through the gateway and never picks a binding the gateway does not serve (A2A 1.x
SDK clients follow ``supportedInterfaces``, so rewriting ``url`` alone would not do). The base
URL is ``A2A_PUBLIC_BASE_URL`` when set, else the request's own scheme and Host
(``X-Forwarded-Proto`` / ``X-Forwarded-Host`` believed only from ``A2A_TRUSTED_PROXIES``; a Host
outside ``ALLOWED_HOSTS`` is replaced by the server's address, and the answer carries
``Vary: Host``).
The card is served from its stored bytes with key order kept on every database. ``ETag`` and
``Cache-Control`` are computed over the rewritten bytes, which are cached per card hash and
base URL. Cards are public unless ``A2A_CARDS_REQUIRE_TOKEN`` is on.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from functools import lru_cache
from typing import Any

import orjson
from channels.db import database_sync_to_async
from django.conf import settings
from django.http.request import split_domain_port, validate_host

from core import lifecycle as node_config
from gateway import errors, metrics
from gateway.headers import scan_request_headers
from registry.auth import UNAUTHENTICATED_MESSAGE
from registry.bindings import rewrite_card_endpoints
from registry.ids import AGENT_ID_RE
from registry.selectors import agent_get
from registry.token_cache import AuthFailed

MAX_CACHED = 4096
_HOST_RE = re.compile(r"^[A-Za-z0-9.\-]+(:\d{1,5})?$|^\[[0-9A-Fa-f:.]+\](:\d{1,5})?$")
_cards: dict[str, dict[str, Any]] = {}  # card sha256 -> card
# (sha, gateway url, gRPC listener port) -> (body, etag)
_rendered: dict[tuple[str, str, int | None], tuple[bytes, bytes]] = {}


def _card_of(agent_id: str) -> tuple[str, dict[str, Any]] | None:
    agent = agent_get(agent_id=agent_id)
    if agent is None or not agent.is_routable:
        return None
    # From the stored bytes, not the JSON column: PostgreSQL's jsonb reorders keys, and
    # clients may read meaning into order (the first securitySchemes entry, say).
    return agent.card_sha256, orjson.loads(agent.card_raw)


@lru_cache(maxsize=64)
def _trusted_networks(proxies: tuple[str, ...]) -> tuple:
    networks = []
    for entry in proxies:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            continue
    return tuple(networks)


def _trusted(client_ip: str | None) -> bool:
    if not client_ip or not settings.A2A_TRUSTED_PROXIES:
        return False
    try:
        address = ipaddress.ip_address(client_ip)
    except ValueError:
        return False
    return any(address in net for net in _trusted_networks(tuple(settings.A2A_TRUSTED_PROXIES)))


def gateway_base_url(scope: dict[str, Any], host: str, forwarded_proto: str,
                     forwarded_host: str) -> str:
    """This gateway's public base URL as the caller reached it."""
    if settings.A2A_PUBLIC_BASE_URL:
        return settings.A2A_PUBLIC_BASE_URL
    scheme = scope.get("scheme") or "http"
    client = scope.get("client")
    if _trusted(client[0] if client else None):
        proto = forwarded_proto.split(",")[0].strip().lower()
        if proto in ("http", "https"):
            scheme = proto
        fhost = forwarded_host.split(",")[0].strip()
        if fhost and _HOST_RE.match(fhost):
            host = fhost
    if not host or not _HOST_RE.match(host) or not host_allowed(host):
        # A Host this node does not answer to is never written into a card.
        server = scope.get("server")
        host = f"{server[0]}:{server[1]}" if server else "localhost"
    return f"{scheme}://{host}"


@lru_cache(maxsize=1024)
def _host_allowed_in(host: str, allowed: tuple[str, ...]) -> bool:
    domain, _port = split_domain_port(host)
    return bool(domain) and validate_host(domain, list(allowed))


def host_allowed(host: str) -> bool:
    """Whether ``host`` is in ``ALLOWED_HOSTS`` (Django's own rule, as its views apply it)."""
    return _host_allowed_in(host.lower(), tuple(settings.ALLOWED_HOSTS))


def vary_headers() -> list[tuple[bytes, bytes]]:
    """``Vary`` for a card whose URLs come from the request (no ``A2A_PUBLIC_BASE_URL``), so a
    shared cache never hands one Host's card to another."""
    if settings.A2A_PUBLIC_BASE_URL:
        return []
    if settings.A2A_TRUSTED_PROXIES:
        return [(b"vary", b"Host, X-Forwarded-Host, X-Forwarded-Proto")]
    return [(b"vary", b"Host")]


def render(card: dict[str, Any], sha: str, gateway_url: str) -> tuple[bytes, bytes]:
    """The rewritten card's bytes and ETag, cached per (card hash, gateway URL, gRPC port)."""
    key = (sha, gateway_url, node_config.grpc_port())
    hit = _rendered.get(key)
    if hit is None:
        body = orjson.dumps(rewrite_card_endpoints(card, gateway_url))
        etag = b'"' + hashlib.sha256(body).hexdigest()[:32].encode() + b'"'
        if len(_rendered) >= MAX_CACHED:
            _rendered.clear()
        hit = _rendered[key] = (body, etag)
    return hit


def _etag_matches(header: str, etag: bytes) -> bool:
    wanted = etag.decode()
    for candidate in header.split(","):
        candidate = candidate.strip()
        if candidate == "*" or candidate.removeprefix("W/") == wanted:
            return True
    return False


async def serve_card(node, scope: dict[str, Any], receive, send, agent_id: str) -> None:
    headers = scan_request_headers(scope["headers"])
    if not AGENT_ID_RE.match(agent_id):
        await _json(send, 404, errors.error_body(errors.INVALID_REQUEST, agent_id=None,
                                                 detail="invalid agent id"), scope)
        return
    if settings.A2A_CARDS_REQUIRE_TOKEN:
        try:
            actor = await node.tokens.actor(headers.authorization)
        except AuthFailed as exc:
            actor, detail = None, str(exc)
        else:
            detail = UNAUTHENTICATED_MESSAGE
        if actor is None:
            await _json(send, 401, errors.error_body(errors.UNAUTHENTICATED, agent_id=agent_id,
                                                     detail=detail), scope)
            return
        if not actor.may_call(agent_id):
            await _json(send, 403, errors.error_body(
                errors.FORBIDDEN, agent_id=agent_id, detail=f"this client may not call {agent_id}"
            ), scope)
            return
    route = node.table.get(agent_id)
    card = _cards.get(route.card_sha256) if route is not None else None
    sha = route.card_sha256 if route is not None else ""
    if route is None or card is None:
        found = await database_sync_to_async(_card_of, thread_sensitive=False)(agent_id)
        if found is None:
            metrics.count_card("not_found")
            await _json(send, 404, errors.error_body(errors.AGENT_NOT_FOUND, agent_id=agent_id),
                        scope)
            return
        sha, card = found
        if len(_cards) >= MAX_CACHED:
            _cards.clear()
        _cards[sha] = card
    base = gateway_base_url(scope, headers.host, headers.forwarded_proto,
                            headers.forwarded_host)
    body, etag = render(card, sha, f"{base}/a2a/{agent_id}/")
    cache_control = (b"private, max-age=300" if settings.A2A_CARDS_REQUIRE_TOKEN
                     else b"public, max-age=300")
    if_none_match = next((v for k, v in scope["headers"] if k == b"if-none-match"), None)
    common = [(b"etag", etag), (b"cache-control", cache_control), *vary_headers()]
    if if_none_match is not None and _etag_matches(if_none_match.decode("latin-1"), etag):
        metrics.count_card("not_modified")
        await send({"type": "http.response.start", "status": 304, "headers": common})
        await send({"type": "http.response.body", "body": b""})
        return
    metrics.count_card("ok")
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *common,
    ]})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


async def _json(send, status: int, body: bytes, scope: dict[str, Any]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})
