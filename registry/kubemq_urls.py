"""The KubeMQ-compatible registry surface."""

urlpatterns: list = []
