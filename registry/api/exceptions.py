"""One error shape for the REST API: ``{"error": "<message>"}`` (plus ``fields`` if any)."""

from __future__ import annotations

from django.core.exceptions import RequestDataTooBig
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from core.outage import is_database_outage, unavailable_response
from registry.auth import UNAUTHENTICATED_MESSAGE
from registry.permissions import PermissionDenied
from registry.quotas import QuotaRateExceeded
from registry.services import AgentNotFound, InvalidInput, RegistrationConflict


def _flatten(detail) -> str:
    if isinstance(detail, dict):
        return "; ".join(f"{k}: {_flatten(v)}" for k, v in detail.items())
    if isinstance(detail, list):
        return "; ".join(_flatten(v) for v in detail)
    return str(detail)


def exception_handler(exc, context):
    if is_database_outage(exc):
        return unavailable_response(exc)  # JSON 503 + Retry-After (core.outage)
    if isinstance(exc, AgentNotFound):
        return Response({"error": "agent not found", "agent_id": exc.agent_id}, status=404)
    if isinstance(exc, InvalidInput):
        return Response({"error": str(exc)}, status=400)
    if isinstance(exc, QuotaRateExceeded):  # a PermissionDenied with a 429 of its own
        return quota_rate_response(exc)
    if isinstance(exc, PermissionDenied):
        return Response({"error": str(exc)}, status=403)
    if isinstance(exc, RegistrationConflict):
        return Response({"error": str(exc)}, status=409)
    if isinstance(exc, RequestDataTooBig):
        return Response({"error": "request body too large"}, status=413)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
    if isinstance(exc, exceptions.NotAuthenticated):
        detail = UNAUTHENTICATED_MESSAGE
    body: dict = {"error": _flatten(detail)}
    if isinstance(exc, exceptions.ValidationError) and isinstance(detail, dict):
        body["fields"] = detail
    response.data = body
    if response.status_code == status.HTTP_403_FORBIDDEN and isinstance(
        exc, exceptions.NotAuthenticated
    ):
        response.status_code = 401
    return response


def quota_rate_response(exc: QuotaRateExceeded) -> Response:
    """A tenant's rate quota refused the request: 429 ``{"error", "retry_after"}`` (the shape
    of the API's other retryable answer, core.outage's 503) with ``Retry-After``."""
    return Response({"error": str(exc), "retry_after": exc.retry_after}, status=429,
                    headers={"Retry-After": str(exc.retry_after)})
