"""/api/v1 routes of discovery: snapshots and session pins."""

from django.urls import path, re_path

from discovery import api

urlpatterns = [
    re_path(r"^snapshots/current/?$", api.SnapshotCurrentView.as_view(), name="snapshot-current"),
    re_path(r"^snapshots/(?P<digest>[0-9a-f]{64})/?$", api.SnapshotDetailView.as_view(),
            name="snapshot-detail"),
    re_path(r"^sessions/?$", api.SessionListView.as_view(), name="session-list"),
    path("sessions/<str:session_id>", api.SessionDetailView.as_view(), name="session-detail"),
    path("sessions/<str:session_id>/", api.SessionDetailView.as_view()),
]
