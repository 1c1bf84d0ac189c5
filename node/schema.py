"""OpenAPI post-processing: the answers every operation may give besides its success.

Views declare their success bodies; the error answers are the same across the API (one error
shape, ``{"error": "...", ...}``), so they are added here in one place, operation by operation,
from what the operation takes: 400 (it takes parameters or a body), 401/403 (it needs a token),
404 (its path names something), 405 (KubeMQ's action segment), 409/404 where one
operation answers them, 429 (registrations: a tenant's registrations per minute), 413 (it
takes a body), 503 (the database is unreachable: ``core.outage``). Security follows the
settings: with anonymous access on, or for cards while ``A2A_CARDS_REQUIRE_TOKEN`` is off, the
token is optional.
Schemathesis (tests/fuzz) holds the API to this document.
"""

from __future__ import annotations

from django.conf import settings

ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {"type": "string"},
        "agent_id": {"type": "string"},
        "fields": {"type": "object", "additionalProperties": {}},
        "retry_after": {"type": "integer"},
    },
    "required": ["error"],
}
_ERROR_REF = {"$ref": "#/components/schemas/Error"}
_DESCRIPTIONS = {
    "400": "invalid input",
    "401": "no token, or an invalid or revoked token",
    "403": "the token's client may not do this",
    "404": "not found",
    "405": "unknown action",
    "409": "conflict with the current state",
    "406": "the Accept header names no media type the API answers in (JSON)",
    "413": "request body too large",
    "415": "the body's Content-Type is not one the API reads (JSON)",
    "429": "a tenant quota on registrations per minute (docs/tenants.md): retry after "
           "Retry-After seconds",
    "503": "database unavailable: retry after Retry-After seconds",
}
_PUBLIC_CARD_OPERATIONS = {"kubemq_platform_card"}
_KUBEMQ_ACTION = "kubemq_agents_action"
# Answers particular to one operation: pinning before discovery published a snapshot (409),
# reading the current snapshot before there is one (404).
# A registration past its tenant's registrations per minute (429).
_EXTRA = {("post", "/api/v1/sessions/"): ["409"], ("get", "/api/v1/snapshots/current/"): ["404"],
          ("post", "/api/v1/agents/"): ["429"]}
_METHODS = {"get", "post", "put", "patch", "delete"}


def _error(code: str) -> dict:
    response = {
        "description": _DESCRIPTIONS[code],
        "content": {"application/json": {"schema": _ERROR_REF}},
    }
    if code in ("503", "429"):
        response["headers"] = {"Retry-After": {"schema": {"type": "integer"}}}
    return response


def document_errors(result: dict, generator, request, public) -> dict:
    """drf-spectacular POSTPROCESSING_HOOK: add the error answers and optional security."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    for path, item in result.get("paths", {}).items():
        for method, operation in item.items():
            if method not in _METHODS:
                continue
            responses = operation.setdefault("responses", {})
            codes = ["503"] if path.startswith("/a2a/") else ["503", "406"]
            if operation.get("parameters") or operation.get("requestBody"):
                codes.append("400")
            if operation.get("security") is not None or "{" in path:
                codes += ["401", "403"]
            if "{" in path:
                codes.append("404")
            if operation.get("requestBody") or method in ("post", "patch", "put"):
                codes.append("413")
            if operation.get("requestBody"):
                codes.append("415")
            if operation.get("operationId") == _KUBEMQ_ACTION:
                codes += ["405", "429"]  # the action "register": a tenant's registration rate
            codes += _EXTRA.get((method, path), [])
            for code in codes:
                responses.setdefault(code, _error(code))
            public_card = (
                operation.get("operationId") in _PUBLIC_CARD_OPERATIONS
                and not settings.A2A_CARDS_REQUIRE_TOKEN
            )
            if (public_card or settings.A2A_ALLOW_ANONYMOUS) and operation.get("security"):
                if {} not in operation["security"]:
                    operation["security"].append({})  # a token is optional here
    return result
