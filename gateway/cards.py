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
from typing import TYPE_CHECKING, Any

import orjson
from a2a.types import a2a_pb2
from a2a.utils.proto_utils import parse_lenient
from channels.db import database_sync_to_async
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from google.protobuf.json_format import MessageToDict

from core import lifecycle as node_config
from gateway import errors, metrics
from gateway.bodies import Receive, Send, WholeAnswer
from gateway.headers import RequestHeaders, scan_request_headers
from registry.auth import UNAUTHENTICATED_MESSAGE
from registry.bindings import rewrite_card_endpoints
from registry.ids import AGENT_KEY_RE, DEFAULT_TENANT, gateway_path, split_agent_key
from registry.permissions import PUBLIC
from registry.selectors import agent_get_by_key
from registry.token_cache import AuthFailed

if TYPE_CHECKING:
    from gateway.runtime import GatewayNode

MAX_CACHED = 4096
_HOST_RE = re.compile(r"^[A-Za-z0-9.\-]+(:\d{1,5})?$|^\[[0-9A-Fa-f:.]+\](:\d{1,5})?$")
_cards: dict[str, dict[str, Any]] = {}  # card sha256 -> card
# (sha, gateway url, gRPC listener port) -> (body, etag)
_rendered: dict[tuple[str, str, int | None], tuple[bytes, bytes]] = {}


def _card_of(agent_id: str) -> tuple[str, dict[str, Any]] | None:
    agent = agent_get_by_key(key=agent_id)
    if agent is None or not agent.is_routable:
        return None
    # From the stored bytes, not the JSON column: PostgreSQL's jsonb reorders keys, and
    # clients may read meaning into order (the first securitySchemes entry, say).
    return agent.card_sha256, orjson.loads(agent.card_raw)


@lru_cache(maxsize=64)
def _trusted_networks(
    proxies: tuple[str, ...],
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
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


async def serve_card(node: GatewayNode, scope: dict[str, Any], receive: Receive, send: Send,
                     agent_id: str) -> None:
    headers = scan_request_headers(scope["headers"])
    if not AGENT_KEY_RE.match(agent_id):
        await _json(send, 404, errors.error_body(errors.INVALID_REQUEST, agent_id=None,
                                                 detail="invalid agent id"), scope)
        return
    route = node.table.get(agent_id)
    tenant = split_agent_key(agent_id)[0]
    # docs/tenants.md: another tenant's card is served only to callers within its reach,
    # unless the agent is published to every tenant.
    tenanted = tenant != DEFAULT_TENANT and (route is None or route.visibility != PUBLIC)
    if settings.A2A_CARDS_REQUIRE_TOKEN or tenanted:
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
        if not (actor.reaches(route) if route is not None else actor.in_tenant(tenant)):
            metrics.count_card("not_found")
            await _json(send, 404, errors.error_body(errors.AGENT_NOT_FOUND, agent_id=agent_id),
                        scope)
            return
        if not actor.may_call(agent_id, route):
            await _json(send, 403, errors.error_body(
                errors.FORBIDDEN, agent_id=agent_id, detail=f"this client may not call {agent_id}"
            ), scope)
            return
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
    body, etag = render(card, sha, f"{base}{gateway_path(agent_id)}")
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


async def _json(send: Send, status: int, body: bytes, scope: dict[str, Any]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


# --- the extended agent card (A2A's GetExtendedAgentCard) -------------------------------------

#: The extended card's methods: A2A 1.0 (every binding's name) and 0.3 JSON-RPC.
EXTENDED_CARD_METHODS = frozenset({"GetExtendedAgentCard", "agent/getAuthenticatedExtendedCard"})
#: Why an anonymous caller (``A2A_ALLOW_ANONYMOUS``) gets no extended card.
EXTENDED_CARD_ANONYMOUS = "the extended agent card is answered to authenticated callers only"


def gateway_url(scope: dict[str, Any], headers: RequestHeaders, agent_id: str) -> str:
    """The agent's gateway base (``.../a2a/{agent_id}/``) as the caller reached it: where a
    card answered to that caller points."""
    base = gateway_base_url(scope, headers.host, headers.forwarded_proto, headers.forwarded_host)
    return f"{base}{gateway_path(agent_id)}"


def rewrite_card(card: Any, url: str) -> Any:
    """An agent card the agent answered (the extended card), pointed at the gateway as the
    public card is (:func:`registry.bindings.rewrite_card_endpoints`); anything that is not a
    JSON object is left as it is."""
    return rewrite_card_endpoints(card, url) if isinstance(card, dict) else card


def rewrite_core_card(card: Any, url: str) -> Any:
    """:func:`rewrite_card` of an SDK ``AgentCard`` message (a translated answer)."""
    return parse_lenient(rewrite_card(MessageToDict(card), url), a2a_pb2.AgentCard())


def grpc_gateway_url(agent_id: str) -> str:
    """The agent's gateway base for a gRPC caller, who names no HTTP host:
    ``A2A_PUBLIC_BASE_URL``, else the gRPC listener's host (``localhost`` when it listens on
    every address) with no port -- set ``A2A_PUBLIC_BASE_URL`` for HTTP URLs that work there."""
    base = settings.A2A_PUBLIC_BASE_URL
    if not base:
        address = node_config.grpc_address()
        host = address[0] if address and address[0] not in ("", "0.0.0.0", "::", "[::]") \
            else "localhost"
        base = f"http://[{host}]" if ":" in host else f"http://{host}"
    return f"{base}{gateway_path(agent_id)}"


class CardRewrite(WholeAnswer):
    """The caller's ``send`` for an extended-card call forwarded unchanged (JSON-RPC, or
    HTTP+JSON to the agent's own interface): the agent's answer is held whole (it is a card,
    within the response cap) and its card -- a JSON-RPC response's ``result``, or the HTTP+JSON
    body -- rewritten like the public card before it reaches the caller. Errors, the gateway's
    or the agent's, pass unchanged."""

    __slots__ = ("url", "rest")

    def __init__(self, send: Send, url: str, *, rest: bool) -> None:
        super().__init__(send)
        self.url = url
        self.rest = rest

    async def rewritten(self, body: bytes) -> bytes:
        return self._rewritten(body)

    def _rewritten(self, body: bytes) -> bytes:
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body
        if self.rest:
            if not isinstance(answer, dict) or "error" in answer:
                return body
            return orjson.dumps(rewrite_card(answer, self.url))
        if not isinstance(answer, dict) or not isinstance(answer.get("result"), dict):
            return body
        return orjson.dumps({**answer, "result": rewrite_card(answer["result"], self.url)})
