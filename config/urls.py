"""Django URLs: admin, the /api/v1 REST API, the KubeMQ-compatible surface, health checks.

The /a2a/ gateway is not here: config.asgi routes it to a lean ASGI handler before Django.
"""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import (
    SpectacularAPIView,
    SpectacularRedocView,
    SpectacularSwaggerView,
)

from ard import views as ard_views
from node import views
from push import ingress as push_ingress

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("registry.api.urls")),
    path("api/v1/", include("discovery.api_urls")),
    path("api/schema/", views.methods("GET")(SpectacularAPIView.as_view()), name="schema"),
    # Swagger UI and ReDoc load their assets from this server (drf-spectacular-sidecar).
    path(
        "api/docs/",
        views.methods("GET")(SpectacularSwaggerView.as_view(url_name="schema")),
        name="api-docs",
    ),
    path(
        "api/redoc/",
        views.methods("GET")(
            SpectacularRedocView.as_view(url_name="schema", template_name="console/redoc.html")
        ),
        name="api-redoc",
    ),
    path("healthz", views.healthz),
    path("readyz", views.readyz),
    path(".well-known/ai-catalog.json", ard_views.ai_catalog),
    # Push notifications relayed by the gateway (docs/push.md).
    path("push/<str:relay_id>", push_ingress.push_view, name="push-ingress"),
    path(".well-known/jwks.json", push_ingress.jwks_view, name="push-jwks"),
    path("ard/v1/", include("ard.urls")),
    path("", include("registry.kubemq_urls")),
]

# JSON, never Django's HTML pages; a database outage anywhere in the stack answers 503
# (core.outage).
handler400 = "node.views.bad_request"
handler403 = "node.views.permission_denied"
handler404 = "node.views.not_found"
handler500 = "node.views.server_error"
