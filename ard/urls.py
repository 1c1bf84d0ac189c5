"""The ARD registry API, mounted at ``/ard/v1/`` by config.urls."""

from django.urls import path, re_path

from ard import views

urlpatterns = [
    path("", views.api_root),
    path("search", views.search),
    path("agents", views.agents),
    path("explore", views.explore),
    re_path(r"^(?P<rest>.*)$", views.not_found),
]
