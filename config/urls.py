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

from config import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("registry.api.urls")),
    path("api/v1/", include("discovery.api_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # Swagger UI and ReDoc load their assets from this server (drf-spectacular-sidecar).
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path(
        "api/redoc/",
        SpectacularRedocView.as_view(url_name="schema", template_name="console/redoc.html"),
        name="api-redoc",
    ),
    path("healthz", views.healthz),
    path("readyz", views.readyz),
    path("", include("registry.kubemq_urls")),
]

# JSON for unexpected errors; a database outage anywhere in the stack answers 503 (config.outage).
handler500 = "config.views.server_error"
handler404 = "config.views.not_found"
