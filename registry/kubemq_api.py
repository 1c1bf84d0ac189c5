"""The KubeMQ-compatible registry surface: a drop-in for KubeMQ A2A clients.

Shapes and status codes follow the KubeMQ A2A connector's public docs (kubemq-io/kubemq-a2a,
``docs/reference/endpoints.md`` and ``docs/patterns/registry.md``):

* ``POST /agents/register``: the body *is* the card (``agent_id``, ``name``, ``url`` required;
  optional ``credential_passthrough`` and ``public`` booleans, as in /api/v1); 200 with the card
  enriched with ``registered_at`` / ``last_seen`` (new or re-registered alike).
* ``GET /agents`` (``skill_tags`` = any of the comma-separated tags, ``limit``): a JSON array
  of at most ``A2A_MAX_PAGE_SIZE`` agents, those the reader may see (registry.visibility).
* ``GET /agents/{id}``: the enriched card; 404 ``{"error": "agent not found"}``.
* ``POST /agents/deregister`` ``{"agent_id"}`` and ``DELETE /agents/{id}``: 200; unknown: 404.
* ``POST /agents/heartbeat`` ``{"agent_id"}``: 200 ``{agent_id, last_seen}``; unknown: **400**
  ``{"error": "agent not found"}`` (KubeMQ's code, not ours).
* ``GET /.well-known/agent-card.json``: the platform's own card, named ``kubemq``.

Every answer, errors included, is JSON ``{"error": "..."}``. The views are thin adapters over
:mod:`registry.services` and :mod:`registry.selectors`, the same ones /api/v1 uses.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, permissions
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from registry import selectors, services, visibility
from registry.api.exceptions import exception_handler as api_exception_handler
from registry.auth import (
    UNAUTHENTICATED_MESSAGE,
    IsAuthenticatedOrAnonymousAllowed,
    request_actor,
)
from registry.ids import DEFAULT_TENANT, agent_name_error
from registry.models import Agent
from registry.permissions import PermissionDenied
from registry.quotas import QuotaRateExceeded

logger = logging.getLogger(__name__)

NOT_FOUND = "agent not found"
MAX_SKILL_TAGS = 100  # each tag is one OR-ed condition; SQLite caps expression depth
MAX_LIMIT = 2**31 - 1  # larger values overflow the databases' LIMIT


class _KubeMQError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def kubemq_time(value: datetime) -> str:
    """ISO 8601 in UTC with a ``Z``; fixed-width microseconds so strings compare in time order."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def enriched_card(agent: Agent, request=None) -> dict[str, Any]:
    """The card as registered (key order kept) plus ``agent_id``, ``registered_at``, ``last_seen``.

    Agents registered through /api/v1 with an A2A card get their ``agent_id`` and endpoint
    ``url`` added, so KubeMQ clients can read every listed agent the same way. A reader that is
    neither the owner nor an admin gets the caller's view: endpoints at the gateway.
    """
    if request is None or visibility.sees_internals(request_actor(request), agent):
        card, url = visibility.stored_card(agent), agent.url
    else:
        base = visibility.base_url(request)
        card = visibility.caller_card(agent, base)
        url = visibility.gateway_url(base, agent.key)
    out: dict[str, Any] = {"agent_id": agent.agent_id}
    out.update(card)
    out["agent_id"] = agent.agent_id
    if agent.tenant_id != DEFAULT_TENANT:
        out["tenant"] = agent.tenant_id  # docs/tenants.md: named where not the default
    if not isinstance(out.get("url"), str) or not out.get("url"):
        out["url"] = url
    out["registered_at"] = kubemq_time(agent.registered_at)
    out["last_seen"] = kubemq_time(agent.last_seen)
    return out


def _error(status: int, message: str, **extra: Any) -> Response:
    return Response({"error": message, **extra}, status=status)


def kubemq_exception_handler(exc, context):
    """KubeMQ's error shape ``{"error": "..."}`` for everything; JSON even for the unexpected."""
    if isinstance(exc, _KubeMQError):
        return _error(exc.status, str(exc))
    if isinstance(exc, services.AgentNotFound):
        return _error(404, NOT_FOUND)
    if isinstance(exc, services.InvalidInput):
        return _error(400, str(exc))
    if isinstance(exc, QuotaRateExceeded):  # a PermissionDenied with a 429 of its own
        response = _error(429, str(exc), retry_after=exc.retry_after)
        response["Retry-After"] = str(exc.retry_after)
        return response
    if isinstance(exc, PermissionDenied):
        return _error(403, str(exc))
    response = api_exception_handler(exc, context)
    if response is not None:
        response.data = {"error": response.data.get("error", "request refused")}
        return response
    logger.exception("KubeMQ registry endpoint failed", exc_info=exc)
    return _error(500, "internal error")


def _read_object(request) -> dict[str, Any]:
    """The request body as a JSON object (any Content-Type, as KubeMQ reads it), size-capped."""
    limit = settings.A2A_MAX_CARD_BYTES
    try:
        if int(request.META.get("CONTENT_LENGTH") or 0) > limit:
            raise kubemq_too_large()
    except ValueError:
        raise _KubeMQError(400, "invalid Content-Length") from None
    try:
        body = request.body
    except RequestDataTooBig:
        raise kubemq_too_large() from None
    return parse_object(body)


def kubemq_too_large() -> _KubeMQError:
    return _KubeMQError(
        413, f"request body too large: the limit is {settings.A2A_MAX_CARD_BYTES} bytes"
    )


def parse_object(body: bytes) -> dict[str, Any]:
    """A KubeMQ request body (bytes) as a JSON object; :class:`_KubeMQError` (4xx) if not."""
    if len(body) > settings.A2A_MAX_CARD_BYTES:
        raise kubemq_too_large()
    if not body.strip():
        raise _KubeMQError(400, "request body must be a JSON object")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise _KubeMQError(400, f"invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _KubeMQError(400, "request body must be a JSON object")
    if _contains_nul(data):
        # PostgreSQL cannot store U+0000 in text or jsonb: refuse it here rather than fail there.
        raise _KubeMQError(400, "strings must not contain NUL (U+0000) characters")
    return data


def _contains_nul(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _valid_id(agent_id: Any) -> str:
    if agent_id is None or agent_id == "":
        raise _KubeMQError(400, "agent_id is required")
    error = agent_name_error(agent_id)
    if error:
        raise _KubeMQError(400, error)
    return agent_id


def _required_string(data: dict[str, Any], name: str) -> None:
    value = data.get(name)
    if value is None or value == "":
        raise _KubeMQError(400, f"{name} is required")
    if not isinstance(value, str):
        raise _KubeMQError(400, f"{name} must be a string")
    if not value.strip():
        raise _KubeMQError(400, f"{name} is required")


def _optional_bool(data: dict[str, Any], name: str) -> bool | None:
    value = data.get(name)
    if value is not None and not isinstance(value, bool):
        raise _KubeMQError(400, f"{name} must be true or false")
    return value


def _routable_agent(actor, agent_id: str) -> Agent:
    """The agent as KubeMQ sees it: registered, within its lease and visible to ``actor``,
    else not found (another tenant's out of reach alike: docs/tenants.md)."""
    agent = visibility.visible_agent(actor, agent_id)
    if agent is None or not agent.is_routable:
        raise services.AgentNotFound(agent_id)
    return agent


def _parse_limit(raw: str | None) -> int | None:
    if raw is None or raw.strip() == "":
        return None
    try:
        limit = int(raw.strip())
    except ValueError:
        raise _KubeMQError(400, "limit must be a non-negative integer") from None
    if limit < 0:
        raise _KubeMQError(400, "limit must be a non-negative integer")
    if limit == 0 or limit > MAX_LIMIT:
        return None  # 0: no limit, as KubeMQ reads an unset limit; huge: no limit either
    return limit


def _parse_tags(raw: str) -> list[str] | None:
    tags = list(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
    if len(tags) > MAX_SKILL_TAGS:
        raise _KubeMQError(400, f"skill_tags: at most {MAX_SKILL_TAGS} tags")
    return tags or None


class _AlwaysJSON(BaseContentNegotiation):
    """JSON whatever the Accept header says: KubeMQ clients and browsers alike get JSON."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class KubeMQView(APIView):
    """Base: JSON only (no browsable HTML), bearer tokens as /api/v1, KubeMQ error shape."""

    renderer_classes = [JSONRenderer]
    content_negotiation_class = _AlwaysJSON
    parser_classes: list = []  # bodies are read by _read_object, whatever the Content-Type
    permission_classes = [IsAuthenticatedOrAnonymousAllowed]

    def get_exception_handler(self):
        return kubemq_exception_handler

    def _deregister(self, request, agent_id: Any) -> Response:
        agent_id = _valid_id(agent_id)
        services.agent_deregister(actor=request_actor(request), agent_id=agent_id)
        return Response({"agent_id": agent_id, "status": "deregistered"})


@extend_schema(tags=["kubemq"])
class AgentCollectionView(KubeMQView):
    @extend_schema(
        operation_id="kubemq_agents_list",
        responses={200: {"type": "array", "items": {"type": "object"}}},  # a JSON array
        description="Registered agents as enriched cards; skill_tags: any of the tags.",
    )
    def get(self, request):
        tags = _parse_tags(request.query_params.get("skill_tags", ""))
        limit = _parse_limit(request.query_params.get("limit"))
        # Never more than one page (A2A_MAX_PAGE_SIZE), whatever limit asks for.
        limit = min(limit or settings.A2A_MAX_PAGE_SIZE, settings.A2A_MAX_PAGE_SIZE)
        agents = visibility.agents_visible(
            selectors.agent_list(tags_any=tags, status="active"), request_actor(request)
        )[:limit]
        return Response([enriched_card(agent, request) for agent in agents])


@extend_schema(tags=["kubemq"])
class AgentItemView(KubeMQView):
    """``/agents/{segment}``: the register/deregister/heartbeat actions (POST) or one agent."""

    @extend_schema(
        operation_id="kubemq_agents_action",
        request=OpenApiTypes.OBJECT,
        responses={200: OpenApiTypes.OBJECT},
        description="segment: register (body: the card), deregister or heartbeat "
                    '(body: {"agent_id": ...}).',
    )
    def post(self, request, segment: str):
        if segment == "register":
            return self._register(request)
        if segment == "deregister":
            return self._deregister(request, _read_object(request).get("agent_id"))
        if segment == "heartbeat":
            return self._heartbeat(request)
        raise exceptions.MethodNotAllowed("POST")

    @extend_schema(operation_id="kubemq_agent_get", responses={200: OpenApiTypes.OBJECT})
    def get(self, request, segment: str):
        agent = _routable_agent(request_actor(request), _valid_id(segment))
        return Response(enriched_card(agent, request))

    @extend_schema(operation_id="kubemq_agent_deregister", responses={200: OpenApiTypes.OBJECT})
    def delete(self, request, segment: str):
        return self._deregister(request, segment)

    def _register(self, request) -> Response:
        # Under ASGI, node.registrations answers bearer-token registrations before Django;
        # both use kubemq_register, so the answers are the same.
        data = _read_object(request)
        return Response(kubemq_register(actor=request_actor(request), data=data,
                                        body=bytes(request.body)))

    def _heartbeat(self, request) -> Response:
        status, body = kubemq_heartbeat(actor=request_actor(request), body=request.body)
        return Response(body, status=status)


def kubemq_register(*, actor, data: dict[str, Any], body: bytes) -> dict[str, Any]:
    """``POST /agents/register``: the answer (200) to a registration whose body ``body`` parsed
    as ``data`` (:func:`parse_object`), for the view and the ASGI fast path
    (node.registrations) alike. Refusals raise; both answer them with
    :func:`kubemq_exception_handler`."""
    agent, created = services.register_one(kubemq_registration(actor=actor, data=data,
                                                               body=body))
    return kubemq_registered(agent, created)


def kubemq_registration(*, actor, data: dict[str, Any], body: bytes) -> services.Registration:
    """:func:`kubemq_register`'s checks before any write (the fast path writes what it
    returns together with other registrations)."""
    agent_id = _valid_id(data.get("agent_id"))
    _required_string(data, "name")
    _required_string(data, "url")
    return services.registration(
        actor=actor,
        agent_id=agent_id,
        url=data["url"],
        card=body,  # stored byte-exact: the card is the body
        source=Agent.Source.KUBEMQ,
        credential_passthrough=_optional_bool(data, "credential_passthrough"),
        public=_optional_bool(data, "public"),  # as /api/v1: omitted keeps the flag
    )


def kubemq_registered(agent: Agent, created: bool) -> dict[str, Any]:
    """:func:`kubemq_register`'s answer once written: 200 for new and re-registered alike."""
    return enriched_card(agent)


def kubemq_heartbeat(*, actor, body: bytes) -> tuple[int, dict[str, Any]]:
    """``POST /agents/heartbeat``: status and JSON body, for this view and the ASGI fast path
    (node.heartbeats) alike."""
    try:
        beat = services.agent_heartbeat(actor=actor, agent_id=kubemq_heartbeat_id(body))
    except _KubeMQError as exc:
        return exc.status, {"error": str(exc)}
    except services.AgentNotFound:
        return 400, {"error": NOT_FOUND}  # KubeMQ: heartbeat of an unknown agent -> 400
    except PermissionDenied as exc:
        return 403, {"error": str(exc)}
    return kubemq_heartbeat_answer(beat)


def kubemq_heartbeat_id(body: bytes) -> str:
    """The agent id a heartbeat's body names (``_KubeMQError``: the body's 400/413)."""
    return _valid_id(parse_object(body).get("agent_id"))


def kubemq_heartbeat_answer(beat: services.HeartbeatResult) -> tuple[int, dict[str, Any]]:
    """A renewed lease's answer (the fast path's batched heartbeats answer with it too)."""
    return 200, {"agent_id": beat.agent_id, "last_seen": kubemq_time(beat.last_seen)}


def _base_url(request) -> str:
    return settings.A2A_PUBLIC_BASE_URL or request.build_absolute_uri("/").rstrip("/")


def platform_card(base_url: str) -> dict[str, Any]:
    """The platform's own A2A (0.3) card. Named ``kubemq`` as KubeMQ clients expect."""
    return {
        "name": "kubemq",
        "description": (
            "KubeMQ-compatible A2A gateway and agent registry: register agents at "
            "/agents/register (or /api/v1/agents), call them with JSON-RPC 2.0 at "
            "/a2a/{agent_id}, read each agent's card at "
            "/a2a/{agent_id}/.well-known/agent-card.json."
        ),
        "version": settings.SPECTACULAR_SETTINGS.get("VERSION", "1.0.0"),
        "url": f"{base_url}/",
        "protocolVersion": "0.3.0",
        "preferredTransport": "JSONRPC",
        "documentationUrl": f"{base_url}/api/docs/",
        "provider": {"organization": "A2A Agent Registry", "url": f"{base_url}/"},
        "capabilities": {"streaming": True, "pushNotifications": False},
        "defaultInputModes": ["text"],
        "defaultOutputModes": ["text"],
        "skills": [],
        "protocolVersions": ["1.0"],
    }


class CardsPublicOrToken(permissions.BasePermission):
    """Cards are public by design unless A2A_CARDS_REQUIRE_TOKEN is on."""

    message = UNAUTHENTICATED_MESSAGE

    def has_permission(self, request, view) -> bool:
        if not settings.A2A_CARDS_REQUIRE_TOKEN:
            return True
        return IsAuthenticatedOrAnonymousAllowed().has_permission(request, view)


@extend_schema(
    tags=["kubemq"], operation_id="kubemq_platform_card", responses={200: OpenApiTypes.OBJECT}
)
class PlatformCardView(KubeMQView):
    permission_classes = [CardsPublicOrToken]

    def get(self, request):
        response = Response(platform_card(_base_url(request)))
        response["Cache-Control"] = "public, max-age=300"
        return response
