"""List pagination with a maximum page size (``A2A_MAX_PAGE_SIZE``): ``?limit=100000`` is
answered with one capped page and a ``next`` link, never one huge response."""

from __future__ import annotations

from django.conf import settings
from rest_framework.pagination import LimitOffsetPagination


class CappedLimitOffsetPagination(LimitOffsetPagination):
    @property
    def max_limit(self) -> int:  # type: ignore[override]  # read per request: tests and operators may change it
        return settings.A2A_MAX_PAGE_SIZE

    @property
    def default_limit(self) -> int:  # type: ignore[override]  # read per request
        return min(settings.REST_FRAMEWORK.get("PAGE_SIZE") or 100, settings.A2A_MAX_PAGE_SIZE)  # type: ignore[call-overload]  # PAGE_SIZE is an int
