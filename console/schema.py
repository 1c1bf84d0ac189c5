"""OpenAPI additions: the bearer-token security scheme (so Swagger UI's "Authorize" works) and
the /a2a gateway paths, which are raw ASGI and invisible to drf-spectacular's view walk."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "registry.auth.TokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API client's token: `manage.py create_client NAME --scopes ...`.",
        }


_ERROR_KINDS = [
    "parse_error",
    "invalid_request",
    "agent_not_found",
    "busy",
    "unreachable",
    "timeout",
    "upstream_unavailable",
    "response_too_large",
    "unauthenticated",
    "forbidden",
    "rate_limited",
    "request_too_large",
]

_AGENT_ID = {
    "name": "agent_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{1,62}$"},
    "description": "The registered agent's id.",
}

_EXECUTED = {
    "X-A2A-Executed": {
        "description": "`false` promises the agent never received the request (safe to retry).",
        "schema": {"type": "string", "enum": ["true", "false"]},
    }
}


def _gateway_paths() -> dict[str, Any]:
    rpc_request = {
        "type": "object",
        "required": ["jsonrpc", "method"],
        "properties": {
            "jsonrpc": {"type": "string", "enum": ["2.0"]},
            "id": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            "method": {"type": "string", "example": "message/send"},
            "params": {"type": "object"},
        },
        "example": {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "message/send",
            "params": {
                "message": {
                    "role": "user",
                    "messageId": "m1",
                    "parts": [{"kind": "text", "text": "hi"}],
                }
            },
        },
    }
    rpc_error = {
        "type": "object",
        "properties": {
            "jsonrpc": {"type": "string"},
            "id": {},
            "error": {
                "type": "object",
                "properties": {
                    "code": {"type": "integer"},
                    "message": {"type": "string"},
                    "data": {
                        "type": "object",
                        "properties": {
                            "executed": {"type": "boolean"},
                            "retryable": {"type": "boolean"},
                            "kind": {"type": "string", "enum": _ERROR_KINDS},
                            "agent_id": {"type": "string"},
                        },
                    },
                },
            },
        },
    }
    security = [{"bearerAuth": []}, {}]
    post = {
        "operationId": "gateway_call",
        "tags": ["gateway"],
        "summary": "Call an agent: one A2A JSON-RPC 2.0 request, relayed unchanged",
        "description": (
            "Sync methods answer the agent's JSON-RPC response; streaming methods "
            "(`message/stream`, `tasks/resubscribe`, `SendStreamingMessage`, `SubscribeToTask`) "
            "answer `text/event-stream`. Errors the gateway makes itself are JSON-RPC errors "
            "with `error.data.kind` (HTTP 200; 401/403/413/429 for auth, rights, size, rate)."
        ),
        "parameters": [_AGENT_ID],
        "security": security,
        "requestBody": {"required": True, "content": {"application/json": {"schema": rpc_request}}},
        "responses": {
            "200": {
                "description": "The agent's reply (or a gateway JSON-RPC error)",
                "headers": {
                    **_EXECUTED,
                    "X-A2A-Agent-Status": {
                        "description": "The agent's HTTP status",
                        "schema": {"type": "string"},
                    },
                },
                "content": {
                    "application/json": {"schema": {"oneOf": [{"type": "object"}, rpc_error]}},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            },
            "401": {
                "description": "No or bad token",
                "content": {"application/json": {"schema": rpc_error}},
            },
            "403": {
                "description": "This client may not call the agent",
                "content": {"application/json": {"schema": rpc_error}},
            },
            "413": {"description": "Request too large"},
            "429": {"description": "Rate limited"},
        },
    }
    stream = {
        "operationId": "gateway_stream",
        "tags": ["gateway"],
        "summary": "KubeMQ server-push stream: the agent gets message/stream with empty params",
        "parameters": [_AGENT_ID],
        "security": security,
        "responses": {
            "200": {
                "description": "Server-sent events relayed from the agent",
                "headers": _EXECUTED,
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            }
        },
    }
    card = {
        "operationId": "gateway_agent_card",
        "tags": ["gateway"],
        "summary": "The agent's card with every endpoint URL rewritten to this gateway",
        "parameters": [_AGENT_ID],
        "security": [{}, {"bearerAuth": []}],
        "responses": {
            "200": {
                "description": "The rewritten A2A agent card (ETag, Cache-Control)",
                "content": {"application/json": {"schema": {"type": "object"}}},
            },
            "404": {"description": "No such agent"},
        },
    }
    return {
        "/a2a/{agent_id}": {"post": post},
        "/a2a/{agent_id}/stream": {"get": stream},
        "/a2a/{agent_id}/.well-known/agent-card.json": {"get": card},
    }


def add_gateway_paths(result: dict[str, Any], generator, request, public) -> dict[str, Any]:
    """drf-spectacular post-processing hook: add the gateway's paths and the bearer scheme."""
    result.setdefault("paths", {}).update(_gateway_paths())
    components = result.setdefault("components", {})
    components.setdefault("securitySchemes", {}).setdefault(
        "bearerAuth", {"type": "http", "scheme": "bearer"}
    )
    tags = result.setdefault("tags", [])
    tags.append({"name": "gateway", "description": "The /a2a JSON-RPC gateway (raw ASGI)."})
    return result
