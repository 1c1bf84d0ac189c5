"""The KubeMQ-compatible registry surface (included at the root by config.urls)."""

from django.urls import re_path

from registry import kubemq_api

urlpatterns = [
    re_path(r"^agents/?$", kubemq_api.AgentCollectionView.as_view(), name="kubemq-agents"),
    re_path(
        r"^agents/(?P<segment>[^/]+)/?$", kubemq_api.AgentItemView.as_view(), name="kubemq-agent"
    ),
    re_path(
        r"^\.well-known/agent-card\.json$",
        kubemq_api.PlatformCardView.as_view(),
        name="kubemq-platform-card",
    ),
]
