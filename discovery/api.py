"""/api/v1 views of discovery: snapshots and session pins. Thin adapters over
:mod:`discovery.sessions`, :mod:`discovery.snapshots` and :mod:`discovery.tree_factory`."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, permissions, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from discovery import sessions, snapshots, tree_factory
from discovery.models import SessionPin, Snapshot
from registry.auth import request_actor
from registry.permissions import SCOPE_CALL


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "conflict"


class MayCall(permissions.BasePermission):
    """Sessions build trees that call agents: the ``call`` scope (or admin) is required."""

    message = "this client lacks the call scope"

    def has_permission(self, request, view) -> bool:
        actor = request_actor(request)
        if actor is None:
            raise exceptions.NotAuthenticated()
        return actor.has_scope(SCOPE_CALL)


class SnapshotAgentOutput(serializers.Serializer):
    local_name = serializers.CharField()
    description = serializers.CharField()
    agent_id = serializers.CharField()
    card_sha256 = serializers.CharField()


class SnapshotOutput(serializers.Serializer):
    version = serializers.IntegerField()
    digest = serializers.CharField()
    created_at = serializers.DateTimeField()
    agents = SnapshotAgentOutput(many=True)


class SessionInput(serializers.Serializer):
    session_id = serializers.CharField(max_length=200, trim_whitespace=False)


class SessionAgentOutput(serializers.Serializer):
    local_name = serializers.CharField()
    description = serializers.CharField()
    gateway_url = serializers.CharField()
    card = serializers.JSONField()


class SessionOutput(serializers.Serializer):
    session_id = serializers.CharField()
    digest = serializers.CharField()
    version = serializers.IntegerField()
    agents = SessionAgentOutput(many=True)


def _snapshot_body(snapshot: Snapshot) -> dict:
    return SnapshotOutput({
        "version": snapshot.version, "digest": snapshot.digest,
        "created_at": snapshot.created_at, "agents": snapshot.agents,
    }).data


def _session_body(pin: SessionPin, request) -> dict:
    tree = tree_factory.tree_for(pin.snapshot, base_url=tree_factory.public_base_url(request))
    return SessionOutput({
        "session_id": pin.session_id, "digest": tree.digest, "version": tree.version,
        "agents": [
            {"local_name": a.local_name, "description": a.description,
             "gateway_url": a.gateway_url, "card": a.card}
            for a in tree.agents
        ],
    }).data


def _session_call(fn, **kwargs):
    try:
        return fn(**kwargs)
    except sessions.InvalidSessionId as exc:
        raise exceptions.ValidationError({"session_id": [str(exc)]}) from None
    except sessions.SessionNotFound as exc:
        raise exceptions.NotFound(str(exc)) from None
    except sessions.NoSnapshot as exc:
        raise Conflict(str(exc)) from None


class SnapshotCurrentView(APIView):
    @extend_schema(responses=SnapshotOutput)
    def get(self, request):
        snapshot = snapshots.snapshot_current()
        if snapshot is None:
            raise exceptions.NotFound("no discovery snapshot has been published yet")
        return Response(_snapshot_body(snapshot))


class SnapshotDetailView(APIView):
    @extend_schema(responses=SnapshotOutput)
    def get(self, request, digest: str):
        snapshot = snapshots.snapshot_get(digest=digest)
        if snapshot is None:
            raise exceptions.NotFound(f"snapshot not found: {digest}")
        return Response(_snapshot_body(snapshot))


class SessionListView(APIView):
    permission_classes = [MayCall]

    @extend_schema(request=SessionInput, responses={200: SessionOutput, 201: SessionOutput})
    def post(self, request):
        data = SessionInput(data=request.data)
        data.is_valid(raise_exception=True)
        actor = request_actor(request)
        pin, created = _session_call(
            sessions.session_pin, session_id=data.validated_data["session_id"],
            client_id=actor.client_id if actor else "",
        )
        return Response(_session_body(pin, request),
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class SessionDetailView(APIView):
    permission_classes = [MayCall]

    @extend_schema(responses=SessionOutput)
    def get(self, request, session_id: str):
        pin = _session_call(sessions.session_get, session_id=session_id)
        return Response(_session_body(pin, request))

    @extend_schema(responses={204: None})
    def delete(self, request, session_id: str):
        _session_call(sessions.session_unpin, session_id=session_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
