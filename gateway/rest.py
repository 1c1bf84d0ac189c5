"""The A2A HTTP+JSON (REST) binding's routes under an agent's gateway base.

The gateway answers the binding for every agent. For an agent whose card lists an HTTP+JSON
interface (``AgentRoute.http_json_endpoint``) it forwards each call there unchanged -- HTTP
method, path after ``/a2a/{agent_id}`` and query string -- through the agent's virtual
subscriber, like a JSON-RPC call (same admission, caps, timeouts, header rules, executed flag,
metrics, audit); for any other agent it translates the call to the agent's JSON-RPC and the
answer back (:mod:`gateway.rest_translate`), on the same path.

Routes (the a2a-sdk's ``create_rest_routes``; ``{tenant}/`` may prefix each, and the 0.3 routes
are the same under ``v1/``):

=====================================================  ======  =================================
path                                                   method  A2A method
=====================================================  ======  =================================
``message:send``                                       POST    SendMessage
``message:stream``                                     POST    SendStreamingMessage (stream)
``tasks/{id}``                                         GET     GetTask
``tasks/{id}:cancel``                                  POST    CancelTask
``tasks/{id}:subscribe``                               GET,    SubscribeToTask (stream)
                                                       POST
``tasks``                                              GET     ListTasks
``tasks/{id}/pushNotificationConfigs``                 POST    CreateTaskPushNotificationConfig
``tasks/{id}/pushNotificationConfigs``                 GET     ListTaskPushNotificationConfigs
``tasks/{id}/pushNotificationConfigs/{config_id}``     GET     GetTaskPushNotificationConfig
``tasks/{id}/pushNotificationConfigs/{config_id}``     DELETE  DeleteTaskPushNotificationConfig
``extendedAgentCard`` (0.3: ``v1/card``)               GET     GetExtendedAgentCard
=====================================================  ======  =================================

Whether a call streams is decided by its route, as the binding defines. Forwarded, a tenant
prefix or ``v1/`` is matched but not interpreted: the path goes to the agent as the caller
wrote it, so ``v1/tasks/x`` read as tenant ``v1`` or as the 0.3 prefix reaches the agent alike
(translated, ``v1/`` names a 0.3 route where A2A 0.3 has that route, as on the SDK's
server). The gateway's own paths under the agent base (``stream``, ``stream/{id}``, the
well-known card paths) are matched first: a tenant named ``stream`` is not reachable through
the gateway.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

#: A2A 1.0 method names of the routes whose answer is an event stream.
STREAMING = frozenset({"SendStreamingMessage", "SubscribeToTask"})

_SINGLE: dict[str, dict[str, str]] = {
    "message:send": {"POST": "SendMessage"},
    "message:stream": {"POST": "SendStreamingMessage"},
    "tasks": {"GET": "ListTasks"},
    "extendedAgentCard": {"GET": "GetExtendedAgentCard"},
    "card": {"GET": "GetExtendedAgentCard"},  # 0.3, under v1/
}
_TASK = {"GET": "GetTask"}
_TASK_CANCEL = {"POST": "CancelTask"}
_TASK_SUBSCRIBE = {"GET": "SubscribeToTask", "POST": "SubscribeToTask"}
_PUSH_CONFIGS = {"POST": "CreateTaskPushNotificationConfig",
                 "GET": "ListTaskPushNotificationConfigs"}
_PUSH_CONFIG = {"GET": "GetTaskPushNotificationConfig",
                "DELETE": "DeleteTaskPushNotificationConfig"}
#: Characters a forwarded path keeps as they are (RFC 3986 pchar and "/").
_SAFE = "/:@!$&'()*+,;=-._~"
#: A character a request line cannot carry: a control, a space, DEL or beyond ASCII.
_UNSENDABLE = re.compile(r"[^\x21-\x7e]")


@dataclass(frozen=True, slots=True)
class RestRoute:
    """A request's place in the binding: the methods its path takes (HTTP -> A2A method)."""

    methods: dict[str, str]

    def method(self, http_method: str) -> str | None:
        """The A2A method of ``http_method`` on this path, or None (405)."""
        return self.methods.get(http_method)

    @property
    def allow(self) -> str:
        return ", ".join(self.methods)


def _match(segments: list[str]) -> dict[str, str] | None:
    count = len(segments)
    if count == 1:
        return _SINGLE.get(segments[0])
    if not count or segments[0] != "tasks" or not segments[1]:
        return None
    task = segments[1]
    if count == 2:
        if task.endswith(":cancel"):
            return _TASK_CANCEL if len(task) > 7 else None
        if task.endswith(":subscribe"):
            return _TASK_SUBSCRIBE if len(task) > 10 else None
        return _TASK
    if segments[2] != "pushNotificationConfigs":
        return None
    if count == 3:
        return _PUSH_CONFIGS
    if count == 4 and segments[3]:
        return _PUSH_CONFIG
    return None


def match_route(segments: list[str]) -> dict[str, str] | None:
    """The methods (HTTP -> A2A) of the route ``segments`` name, tenant and ``v1/`` removed."""
    return _match(segments)


#: One route object per methods table, built once: a call's route is looked up, not built.
_ROUTES: dict[int, RestRoute] = {
    id(methods): RestRoute(methods)
    for methods in (*_SINGLE.values(), _TASK, _TASK_CANCEL, _TASK_SUBSCRIBE, _PUSH_CONFIGS,
                    _PUSH_CONFIG)
}
#: The routes of one segment (``message:send``...): the common calls, without a split.
_SINGLE_ROUTES: dict[str, RestRoute] = {
    tail: _ROUTES[id(methods)] for tail, methods in _SINGLE.items()
}


def route_of(tail: str) -> RestRoute | None:
    """The binding's route of ``tail`` (the decoded path after ``/a2a/{agent_id}/``), with
    an optional tenant and ``v1/`` before it; None when it names none. Dot segments never
    match (a path must not climb out of the agent's interface URL)."""
    if "/" not in tail:  # one segment: no tenant, no v1/, no dot segment among the routes
        return _SINGLE_ROUTES.get(tail)
    segments = tail.split("/")
    if len(segments) > 6 or "." in segments or ".." in segments or "" in segments[:2]:
        return None
    for skip in (0, 1, 2):
        methods = _match(segments[skip:])
        if methods is not None:
            return _ROUTES[id(methods)]
    return None


def forwarded_path(scope: dict[str, Any], agent_id: str, tail: str) -> str | None:
    """The path and query the agent gets, after its HTTP+JSON interface URL: ``/`` + the
    request's path after ``/a2a/{agent_id}/`` as the caller encoded it, and ``?query``. None
    when it holds a character a request line cannot carry (the caller's server let it in)."""
    raw = scope.get("raw_path")
    cut = len(agent_id) + 5  # the "/" before the tail, after "/a2a/{agent_id}"
    path = None
    if isinstance(raw, bytes) and raw[cut:cut + 1] == b"/" \
            and raw[:cut] == b"/a2a/" + agent_id.encode("ascii"):
        encoded = raw[cut:].decode("latin-1")
        # Without a "%" the caller's encoding is the decoded path itself (unquote keeps it).
        if encoded[1:] == tail if "%" not in encoded else unquote(encoded[1:]) == tail:
            path = encoded
    if path is None:
        path = "/" + quote(tail, safe=_SAFE)
    query = scope.get("query_string") or b""
    if query:
        path += "?" + query.decode("latin-1")
    if _UNSENDABLE.search(path) is not None:
        return None
    return path
