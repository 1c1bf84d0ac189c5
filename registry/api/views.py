"""The /api/v1 registry API: thin adapters over registry.services and registry.selectors."""

from __future__ import annotations

import django_filters
from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from registry import selectors, services
from registry.api.serializers import (
    AgentOutput,
    AgentRegisterInput,
    AgentUpdateInput,
    HeartbeatOutput,
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
    return 200, dict(HeartbeatOutput(beat).data)


class AgentFilter(django_filters.FilterSet):
    tag = django_filters.CharFilter(method="_filter")
    skill = django_filters.CharFilter(method="_filter")
    input_mode = django_filters.CharFilter(method="_filter")
    output_mode = django_filters.CharFilter(method="_filter")
    status = django_filters.ChoiceFilter(method="_filter", choices=Agent.Status.choices)
    q = django_filters.CharFilter(method="_filter")

    class Meta:
        model = Agent
        fields: list[str] = []

    def _filter(self, queryset, name, value):
        if not value:
            return queryset
        return queryset & selectors.agent_list(**{name: value})


class AgentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Agents: register (POST), list, read, update (PATCH), deregister (DELETE)."""

    lookup_field = "agent_id"
    lookup_value_regex = "[^/]+"
    serializer_class = AgentOutput
    filterset_class = AgentFilter

    def get_queryset(self):
        return selectors.agent_list()

    @extend_schema(request=AgentRegisterInput, responses={200: AgentOutput, 201: AgentOutput})
    def create(self, request):
        data = AgentRegisterInput(data=request.data)
        data.is_valid(raise_exception=True)
        agent, created = services.agent_register(
            actor=request_actor(request), **data.validated_data
        )
        return Response(
            AgentOutput(agent).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )

    @extend_schema(request=AgentUpdateInput, responses=AgentOutput)
    def partial_update(self, request, agent_id: str):
        data = AgentUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        agent = services.agent_update(
            actor=request_actor(request), agent_id=agent_id, **data.validated_data
        )
        return Response(AgentOutput(agent).data)

    def destroy(self, request, agent_id: str):
        services.agent_deregister(actor=request_actor(request), agent_id=agent_id)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses=HeartbeatOutput)
    @action(detail=True, methods=["post"])
    def heartbeat(self, request, agent_id: str):
        # Under ASGI, gateway.heartbeats answers this path before Django; both use this one
        # function so the answers are the same.
        status_code, body = v1_heartbeat(actor=request_actor(request), agent_id=agent_id)
        return Response(body, status=status_code)

    @extend_schema(responses={(200, "application/json"): dict})
    @action(detail=True, methods=["get"])
    def card(self, request, agent_id: str):
        agent = selectors.agent_get(agent_id=agent_id)
        if agent is None:
            raise services.AgentNotFound(agent_id)
        response = HttpResponse(agent.card_raw.encode(), content_type="application/json")
        response["ETag"] = f'"{agent.card_sha256}"'
        return response
