"""/api/v1 views of discovery: snapshots and session pins. Thin adapters over
:mod:`discovery.sessions`, :mod:`discovery.snapshots` and :mod:`discovery.tree_factory`.

Each caller is answered with its tenant's snapshots and sessions (docs/tenants.md); another
tenant's snapshot or session is answered as one that does not exist. A platform admin reads
the default tenant's, another tenant's with ``?tenant=<slug>``, and a snapshot by digest of
any tenant."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, permissions, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from discovery import sessions, snapshots, tree_factory
from discovery.models import SessionPin, Snapshot
from registry.auth import request_actor
from registry.ids import tenant_error
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


def _tenant(request) -> str:
    """The tenant whose snapshots and sessions the caller reads: its own; a platform admin's
    ``?tenant=`` (default: the default tenant)."""
    actor = request_actor(request)
    if actor is None:
        raise exceptions.NotAuthenticated()
    wanted = request.query_params.get("tenant")
    if wanted is None or not actor.is_platform_admin:
        return actor.tenant
    error = tenant_error(wanted)
    if error:
        raise exceptions.ValidationError({"tenant": [error]})
    return wanted


class SnapshotAgentOutput(serializers.Serializer):
    local_name = serializers.CharField()
    description = serializers.CharField()
    agent_id = serializers.CharField()
    card_sha256 = serializers.CharField()


class SnapshotOutput(serializers.Serializer):
    tenant = serializers.CharField()
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
    tenant = serializers.CharField()
    session_id = serializers.CharField()
    digest = serializers.CharField()
    version = serializers.IntegerField()
    agents = SessionAgentOutput(many=True)


def _snapshot_body(snapshot: Snapshot) -> dict:
    return SnapshotOutput({
        "tenant": snapshot.tenant_id, "version": snapshot.version, "digest": snapshot.digest,
        "created_at": snapshot.created_at, "agents": snapshot.agents,
    }).data


def _session_body(pin: SessionPin, request) -> dict:
    tree = tree_factory.tree_for(pin.snapshot, base_url=tree_factory.public_base_url(request))
    return SessionOutput({
        "tenant": pin.tenant_id, "session_id": pin.session_id, "digest": tree.digest,
        "version": tree.version,
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
        snapshot = snapshots.snapshot_current(_tenant(request))
        if snapshot is None:
            raise exceptions.NotFound("no discovery snapshot has been published yet")
        return Response(_snapshot_body(snapshot))


class SnapshotDetailView(APIView):
    @extend_schema(responses=SnapshotOutput)
    def get(self, request, digest: str):
        actor = request_actor(request)
        anyone = actor is not None and actor.is_platform_admin \
            and "tenant" not in request.query_params
        snapshot = snapshots.snapshot_get(digest=digest,
                                          tenant=None if anyone else _tenant(request))
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
            client_id=actor.client_id if actor else "", tenant=_tenant(request),
        )
        return Response(_session_body(pin, request),
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class SessionDetailView(APIView):
    permission_classes = [MayCall]

    @extend_schema(responses=SessionOutput)
    def get(self, request, session_id: str):
        pin = _session_call(sessions.session_get, session_id=session_id, tenant=_tenant(request))
        return Response(_session_body(pin, request))

    @extend_schema(responses={204: None})
    def delete(self, request, session_id: str):
        _session_call(sessions.session_unpin, session_id=session_id, tenant=_tenant(request))
        return Response(status=status.HTTP_204_NO_CONTENT)
