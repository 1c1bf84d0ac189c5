"""The /api/v1 registry API: thin adapters over registry.services and registry.selectors."""

from __future__ import annotations

import hashlib
import threading

import django_filters
import orjson
from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from registry import selectors, services, visibility
from registry.api.parsers import RawJSONParser, raw_json_member
from registry.api.serializers import (
    AgentDetailOutput,
    AgentOutput,
    AgentRegisterInput,
    AgentUpdateInput,
    HeartbeatOutput,
    owner_output,
)
from registry.auth import request_actor
from registry.models import Agent
from registry.permissions import PermissionDenied


def v1_heartbeat(*, actor, agent_id: str) -> tuple[int, dict]:
    """``POST /api/v1/agents/{id}/heartbeat``: status and JSON body (view and fast path)."""
    try:
        beat = services.agent_heartbeat(actor=actor, agent_id=agent_id)
    except services.AgentNotFound:
        return 404, {"error": "agent not found", "agent_id": agent_id}
    except PermissionDenied as exc:
        return 403, {"error": str(exc)}
    return v1_heartbeat_answer(beat)


_TIME = HeartbeatOutput._declared_fields["last_seen"]


def v1_heartbeat_answer(beat: services.HeartbeatResult) -> tuple[int, dict]:
    """A renewed lease's answer (the fast path's batched heartbeats answer with it too):
    ``HeartbeatOutput(beat).data`` (the documented schema), built with the serializer's own
    date-time field but without a serializer per heartbeat, whose fields are deep-copied at
    each construction (a quarter of a loaded node's heartbeat time, py-spy)."""
    return 200, {"agent_id": beat.agent_id,
                 "last_seen": _TIME.to_representation(beat.last_seen),
                 "expires_at": _TIME.to_representation(beat.expires_at),
                 "ttl_seconds": beat.ttl_seconds}


_register_input = threading.local()


def register_input(data) -> dict:
    """``AgentRegisterInput(data=data)``'s validated data (its ValidationError as DRF raises it),
    from one serializer per thread: building a Serializer's fields (a deep copy of each
    declared field) cost more than validating a registration (py-spy on a loaded node)."""
    serializer = getattr(_register_input, "serializer", None)
    if serializer is None:
        serializer = _register_input.serializer = AgentRegisterInput(data={})
    for attr in ("_validated_data", "_errors", "_data"):  # is_valid()'s results of the last
        serializer.__dict__.pop(attr, None)
    serializer.initial_data = data
    try:
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data
    finally:
        serializer.initial_data = None  # hold no request's data past its validation


def require_json_body(request) -> None:
    """Refuse a body sent without a Content-Type: DRF would read it as empty and answer
    "agent_id: This field is required", which hides the real mistake."""
    has_body = request.META.get("CONTENT_LENGTH") not in (None, "", "0") or (
        "HTTP_TRANSFER_ENCODING" in request.META
    )
    if has_body and not request.content_type:
        raise exceptions.UnsupportedMediaType(
            "",
            detail="the request body was sent without a Content-Type header: "
            "send Content-Type: application/json",
        )


def _with_raw_card(request, validated: dict) -> dict:
    """The card as the bytes the client sent (stored byte-exact), not re-serialized."""
    return _with_raw_card_of(getattr(request, "raw_json_body", None), validated)


def _with_raw_card_of(body: bytes | None, validated: dict) -> dict:
    if isinstance(validated.get("card"), dict):
        raw = raw_json_member(body, "card")
        if raw is not None:
            return {**validated, "card": raw}
    return validated


def v1_register(*, actor, data, body: bytes | None) -> tuple[int, dict]:
    """``POST /api/v1/agents``: status and JSON body of a registration whose request body
    ``body`` parsed as ``data`` (the DRF view and the ASGI fast path, node.registrations).
    Refusals raise; both surfaces answer them with the API's exception handler
    (:func:`registry.api.exceptions.exception_handler`).
    """
    return v1_registered(*services.register_one(v1_registration(actor=actor, data=data,
                                                                 body=body)))


def v1_registration(*, actor, data, body: bytes | None) -> services.Registration:
    """:func:`v1_register`'s checks (validation, scopes, card, URL) before any write; the
    fast path writes what it returns together with other registrations."""
    return services.registration(actor=actor, **_with_raw_card_of(body, register_input(data)))


def v1_registered(agent: Agent, created: bool) -> tuple[int, dict]:
    """:func:`v1_register`'s answer once the registration is written."""
    return (201 if created else 200), owner_output(agent)


class AgentFilter(django_filters.FilterSet):
    tag = django_filters.CharFilter(method="_filter")
    skill = django_filters.CharFilter(method="_filter")
    input_mode = django_filters.CharFilter(method="_filter")
    output_mode = django_filters.CharFilter(method="_filter")
    status = django_filters.ChoiceFilter(method="_filter", choices=Agent.Status.choices)
    # docs/tenants.md: the agents of one tenant among those the caller sees.
    tenant = django_filters.CharFilter(field_name="tenant")
    # Declared last, so it ranks what the other filters (and visibility) left: best first.
    q = django_filters.CharFilter(method="_search")

    class Meta:
        model = Agent
        fields: list[str] = []

    def _search(self, queryset, name, value):
        return selectors.agents_search(queryset, value) if value.strip() else queryset

    def _filter(self, queryset, name, value):
        if not value:
            return queryset
        return queryset & selectors.agent_list(**{name: value})


class AgentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Agents: register (POST), list, read, update (PATCH), deregister (DELETE)."""

    parser_classes = [RawJSONParser]
    lookup_field = "agent_id"
    lookup_value_regex = "[^/]+"
    serializer_class = AgentOutput
    filterset_class = AgentFilter

    def get_queryset(self):
        return visibility.agents_visible(selectors.agent_list(), request_actor(self.request))

    def get_serializer_class(self):
        return AgentDetailOutput if self.action == "retrieve" else AgentOutput

    def get_object(self):
        """The agent the path names (a bare id: the caller's tenant; ``{tenant}.{agent_id}``:
        that tenant's), among those the caller sees; unknown and unseen alike are 404."""
        agent_id = self.kwargs["agent_id"]
        agent = visibility.visible_agent(request_actor(self.request), agent_id)
        if agent is None:
            raise services.AgentNotFound(agent_id)
        return agent

    @extend_schema(request=AgentRegisterInput, responses={200: AgentOutput, 201: AgentOutput})
    def create(self, request):
        # Under ASGI, node.registrations answers bearer-token JSON registrations before
        # Django; both use v1_register, so the answers are the same.
        require_json_body(request)
        status_code, body = v1_register(actor=request_actor(request), data=request.data,
                                        body=getattr(request, "raw_json_body", None))
        return Response(body, status=status_code)

    @extend_schema(request=AgentUpdateInput, responses=AgentOutput)
    def partial_update(self, request, agent_id: str):
        require_json_body(request)
        data = AgentUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        agent = services.agent_update(
            actor=request_actor(request),  # type: ignore[arg-type]  # the permission class: an actor
            agent_id=agent_id,
            **_with_raw_card(request, data.validated_data),
        )
        return Response(AgentOutput(agent).data)

    def destroy(self, request, agent_id: str):
        services.agent_deregister(actor=request_actor(request), agent_id=agent_id)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses=HeartbeatOutput)
    @action(detail=True, methods=["post"])
    def heartbeat(self, request, agent_id: str):
        # Under ASGI, node.heartbeats answers this path before Django; both use this one
        # function so the answers are the same.
        status_code, body = v1_heartbeat(actor=request_actor(request), agent_id=agent_id)
        return Response(body, status=status_code)

    @extend_schema(responses={(200, "application/json"): dict})
    @action(detail=True, methods=["get"])
    def card(self, request, agent_id: str):
        actor = request_actor(request)
        agent = visibility.visible_agent(actor, agent_id)
        if agent is None:
            raise services.AgentNotFound(agent_id)
        if visibility.sees_internals(actor, agent):
            # The owner's card as registered, byte-exact (signatures intact).
            response = HttpResponse(agent.card_raw.encode(), content_type="application/json")
            response["ETag"] = f'"{agent.card_sha256}"'
            return response
        body = orjson.dumps(visibility.caller_card(agent, visibility.base_url(request)))
        response = HttpResponse(body, content_type="application/json")
        response["ETag"] = f'"{hashlib.sha256(body).hexdigest()[:32]}"'
        response["Vary"] = "Authorization, Host"
        return response
