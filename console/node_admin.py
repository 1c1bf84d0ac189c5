"""The cluster's nodes (server processes, :class:`registry.models.Node`) in the Django admin:
read-only, with whether each is alive and how many agents it owns (one subquery, whatever the
row count)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from console.site import ReadOnlyAdmin
from registry.models import Agent, Node


@admin.register(Node)
class NodeAdmin(ReadOnlyAdmin):
    """The cluster's server processes, as they report themselves. Read-only."""

    list_display = ("node_id", "address", "alive", "started_at", "last_heartbeat", "agent_count")
    search_fields = ("node_id", "address")
    ordering = ("node_id",)

    def get_queryset(self, request):
        agents = (
            Agent.objects.filter(node_id=OuterRef("node_id"))
            .order_by().values("node_id").annotate(n=Count("pk")).values("n")
        )
        return super().get_queryset(request).annotate(
            _agent_count=Coalesce(Subquery(agents, output_field=IntegerField()), 0)
        )

    @admin.display(boolean=True, description="alive")
    def alive(self, node: Node) -> bool:
        window = 3 * settings.A2A_NODE_HEARTBEAT_SECONDS
        return (timezone.now() - node.last_heartbeat).total_seconds() <= window

    @admin.display(description="agents", ordering="_agent_count")
    def agent_count(self, node: Node) -> int:
        return node._agent_count  # type: ignore[attr-defined]  # from .annotate(_agent_count=...)
