"""/api/v1 routes of discovery: snapshots and session pins."""

urlpatterns: list = []
