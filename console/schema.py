"""OpenAPI additions: the bearer-token security scheme (so Swagger UI's "Authorize" works) and
the /a2a gateway paths, which are raw ASGI and invisible to drf-spectacular's view walk."""

from __future__ import annotations

from typing import Any

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
                            "agent_id": {"type": "string", "nullable": True},
                        },
                    },
                },
            },
        },
    }
    security: list[dict[str, list[str]]] = [{"bearerAuth": []}, {}]
    # The gateway's own refusals, answered before any agent is involved.
    refusals = {
        "401": {
            "description": "No or bad token",
            "content": {"application/json": {"schema": rpc_error}},
        },
        "403": {
            "description": "This client may not call the agent",
            "content": {"application/json": {"schema": rpc_error}},
        },
    }
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
                    "application/json": {"schema": {"anyOf": [{"type": "object"}, rpc_error]}},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            },
            **refusals,
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
                "description": "Server-sent events relayed from the agent, or a JSON-RPC error "
                "the gateway made (unknown agent, unreachable, ...)",
                "headers": _EXECUTED,
                "content": {
                    "text/event-stream": {"schema": {"type": "string"}},
                    "application/json": {"schema": rpc_error},
                },
            },
            **refusals,
            "429": {"description": "Rate limited"},
        },
    }
    resume = {
        "operationId": "gateway_stream_resume",
        "tags": ["gateway"],
        "summary": "Resume a dropped stream after Last-Event-ID (docs/streams.md)",
        "parameters": [
            _AGENT_ID,
            {"name": "stream_id", "in": "path", "required": True,
             "schema": {"type": "string"}, "description": "the X-A2A-Stream-Id of the stream"},
            {"name": "Last-Event-ID", "in": "header", "required": False,
             "schema": {"type": "string"}, "description": "the id of the last event received"},
            {"name": "last_event_id", "in": "query", "required": False,
             "schema": {"type": "string"},
             "description": "Last-Event-ID for clients without headers"},
        ],
        "security": security,
        "responses": {
            "200": {
                "description": "The missed events, then the live stream",
                "headers": _EXECUTED,
                "content": {
                    "text/event-stream": {"schema": {"type": "string"}},
                    "application/json": {"schema": rpc_error},
                },
            },
            **refusals,
            "404": {
                "description": "Unknown, expired or foreign stream (stream_not_found)",
                "content": {"application/json": {"schema": rpc_error}},
            },
            "429": {"description": "Rate limited"},
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
        "/a2a/{agent_id}/stream/{stream_id}": {"get": resume},
        "/a2a/{agent_id}/.well-known/agent-card.json": {"get": card},
        # docs/tenants.md: another tenant's agents, every route above under this base.
        "/a2a/t/{tenant}/{agent_id}": {"post": _in_tenant(post)},
        "/a2a/t/{tenant}/{agent_id}/.well-known/agent-card.json": {"get": _in_tenant(card)},
        **_rest_paths(security),
    }


_TENANT = {
    "name": "tenant",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{1,39}$"},
    "description": "The agent's tenant (docs/tenants.md); /a2a/{agent_id} is the default "
                   "tenant's.",
}


def _in_tenant(operation: dict[str, Any]) -> dict[str, Any]:
    """``operation`` for an agent of another tenant (``/a2a/t/{tenant}/{agent_id}...``)."""
    return {**operation, "operationId": operation["operationId"] + "_in_tenant",
            "parameters": [_TENANT, *operation["parameters"]],
            "summary": operation["summary"] + " (an agent of another tenant)"}


#: The A2A HTTP+JSON binding's routes (gateway.rest): (path after the agent base, method,
#: A2A method, streams).
_REST_ROUTES = [
    ("message:send", "post", "SendMessage", False),
    ("message:stream", "post", "SendStreamingMessage", True),
    ("tasks", "get", "ListTasks", False),
    ("tasks/{id}", "get", "GetTask", False),
    ("tasks/{id}:cancel", "post", "CancelTask", False),
    ("tasks/{id}:subscribe", "get", "SubscribeToTask", True),
    ("tasks/{id}/pushNotificationConfigs", "post", "CreateTaskPushNotificationConfig", False),
    ("tasks/{id}/pushNotificationConfigs", "get", "ListTaskPushNotificationConfigs", False),
    ("tasks/{id}/pushNotificationConfigs/{config_id}", "get",
     "GetTaskPushNotificationConfig", False),
    ("tasks/{id}/pushNotificationConfigs/{config_id}", "delete",
     "DeleteTaskPushNotificationConfig", False),
    ("extendedAgentCard", "get", "GetExtendedAgentCard", False),
]


def _rest_paths(security: list) -> dict[str, Any]:
    """The HTTP+JSON binding's 1.0 routes under ``/a2a/{agent_id}/`` (the 0.3 ones under
    ``v1/`` and a ``{tenant}/`` prefix are the same operations, not listed again)."""
    status = {
        "type": "object",
        "properties": {"error": {"type": "object", "properties": {
            "code": {"type": "integer"},
            "status": {"type": "string"},
            "message": {"type": "string"},
            "details": {"type": "array", "items": {"type": "object"}},
        }}},
    }
    error = {"content": {"application/json": {"schema": status}}}
    gateway_errors = {
        "400": {"description": "Not a JSON object body, or an invalid agent id", **error},
        "401": {"description": "No or bad token", **error},
        "403": {"description": "This client may not call the agent", **error},
        "404": {"description": "No such agent (or the agent's own 404)", **error},
        "413": {"description": "Request too large", **error},
        "429": {"description": "Busy (the agent's concurrency cap) or rate limited", **error},
        "501": {"description": "A method the agent's A2A version has not (ListTasks, 0.3)",
                **error},
        "502": {"description": "The agent is unreachable or unavailable", **error},
        "504": {"description": "The agent timed out", **error},
    }
    paths: dict[str, Any] = {}
    for route, method, a2a_method, streams in _REST_ROUTES:
        params = [_AGENT_ID] + [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"},
             "description": "A task id" if name == "id" else "A push notification config id"}
            for name in ("id", "config_id") if f"{{{name}}}" in route
        ]
        content: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
        if streams:
            content = {"text/event-stream": {"schema": {"type": "string"}}, **content}
        operation: dict[str, Any] = {
            "operationId": f"gateway_rest_{a2a_method}",
            "tags": ["gateway"],
            "summary": f"A2A HTTP+JSON {a2a_method}, forwarded to the agent's HTTP+JSON "
                       "interface (docs/gateway.md)",
            "parameters": params,
            "security": security,
            "responses": {
                "200": {"description": "The agent's answer, relayed unchanged (any of its "
                                       "statuses)", "headers": _EXECUTED, "content": content},
                **gateway_errors,
            },
        }
        if method == "post":
            operation["requestBody"] = {"required": False, "content": {
                "application/json": {"schema": {"type": "object"}}}}
        paths.setdefault(f"/a2a/{{agent_id}}/{route}", {})[method] = operation
    return paths


def _kubemq_paths(paths: dict[str, Any]) -> None:
    """Spell out the KubeMQ-compatible actions that share the ``/agents/{segment}`` route."""
    generic = paths.pop("/agents/{segment}/", None) or paths.pop("/agents/{segment}", None)
    if generic is None:
        return
    obj = {"application/json": {"schema": {"type": "object"}}}
    security = generic.get("post", {}).get("security", [{"bearerAuth": []}])

    def action(op_id: str, summary: str, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "post": {
                "operationId": op_id,
                "tags": ["kubemq"],
                "summary": summary,
                "security": security,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": body}},
                },
                "responses": {
                    "200": {"description": "KubeMQ-shaped JSON", "content": obj},
                    "400": {"description": "Bad input", "content": obj},
                    "404": {"description": "Agent not found", "content": obj},
                },
            }
        }

    agent_ref = {
        "type": "object",
        "required": ["agent_id"],
        "properties": {"agent_id": {"type": "string"}},
    }
    paths["/agents/register"] = action(
        "kubemq_register",
        "Register an agent: the body is its card (KubeMQ-style or A2A)",
        {
            "type": "object",
            "required": ["agent_id", "name", "url"],
            "properties": {
                "agent_id": {"type": "string"},
                "name": {"type": "string"},
                "url": {"type": "string"},
                "skills": {"type": "array", "items": {}},
                "ttl_seconds": {"type": "integer"},
            },
            "additionalProperties": True,
        },
    )
    paths["/agents/deregister"] = action("kubemq_deregister", "Deregister an agent", agent_ref)
    paths["/agents/heartbeat"] = action("kubemq_heartbeat", "Renew an agent's TTL", agent_ref)
    item = {k: v for k, v in generic.items() if k in ("get", "delete")}
    for op in item.values():
        op["parameters"] = [dict(_AGENT_ID)]
        op["summary"] = (
            "Read one agent (enriched card)" if op is item.get("get") else "Deregister one agent"
        )
    paths["/agents/{agent_id}"] = item
    listing = paths.get("/agents/", {}).get("get")
    if listing is not None:
        listing["parameters"] = [
            {
                "name": "skill_tags",
                "in": "query",
                "schema": {"type": "string"},
                "description": "Comma-separated tags: agents with any of them.",
            },
            {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}},
        ]


def add_gateway_paths(result: dict[str, Any], generator, request, public) -> dict[str, Any]:
    """drf-spectacular post-processing hook: add the gateway's paths, spell out the KubeMQ
    actions, and make sure the bearer scheme is declared."""
    _kubemq_paths(result.setdefault("paths", {}))
    result["paths"].update(_gateway_paths())
    components = result.setdefault("components", {})
    components.setdefault("securitySchemes", {}).setdefault(
        "bearerAuth", {"type": "http", "scheme": "bearer"}
    )
    tags = result.setdefault("tags", [])
    tags.append({"name": "gateway", "description": "The /a2a gateway (raw ASGI): JSON-RPC, and "
                 "the HTTP+JSON binding for agents that offer it."})
    return result
