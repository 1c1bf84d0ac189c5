"""Which paths under an agent's gateway base are routes of the A2A HTTP+JSON binding, and the
path the agent gets (gateway.rest): the a2a-sdk's own route table, read from its sources."""

from __future__ import annotations

import pytest
from a2a.compat.v0_3.rest_adapter import REST03Adapter
from a2a.server.routes import create_rest_routes

from gateway.rest import STREAMING, forwarded_path, route_of

EXAMPLES = {"{id}": "t-1", "{push_id}": "c-1"}


def sdk_routes() -> list[tuple[str, str]]:
    """(path, method) of every route the SDK's REST server serves (1.0, and 0.3 under /v1)."""
    routes = []
    for route in create_rest_routes(request_handler=None, enable_v0_3_compat=True):
        for method in getattr(route, "methods", None) or []:
            if method != "HEAD":
                routes.append((route.path, method))
    assert any(path.startswith("/v1/") for path, _ in routes)
    return routes


def concrete(path: str) -> str:
    for name, value in EXAMPLES.items():
        path = path.replace(name, value)
    return path.lstrip("/")


def test_every_sdk_route_is_a_route_with_its_method():
    for path, method in sdk_routes():
        tail = concrete(path)
        for prefix in ("", "tenant-a/"):
            route = route_of(prefix + tail)
            assert route is not None, prefix + tail
            assert route.method(method) is not None, (method, prefix + tail)
    assert REST03Adapter  # the 0.3 routes come from the SDK's compat adapter


@pytest.mark.parametrize(("tail", "method", "a2a"), [
    ("message:send", "POST", "SendMessage"),
    ("message:stream", "POST", "SendStreamingMessage"),
    ("tasks/t-1:subscribe", "GET", "SubscribeToTask"),
    ("tasks/t-1:subscribe", "POST", "SubscribeToTask"),
    ("v1/tasks/t-1:cancel", "POST", "CancelTask"),
    ("t/v1/tasks/t-1", "GET", "GetTask"),
    ("tasks", "GET", "ListTasks"),
    ("tasks/t/pushNotificationConfigs/c", "DELETE", "DeleteTaskPushNotificationConfig"),
    ("extendedAgentCard", "GET", "GetExtendedAgentCard"),
    ("v1/card", "GET", "GetExtendedAgentCard"),
])
def test_methods_and_streaming_by_route(tail, method, a2a):
    route = route_of(tail)
    assert route is not None and route.method(method) == a2a
    assert (a2a in STREAMING) == (a2a in ("SendStreamingMessage", "SubscribeToTask"))


@pytest.mark.parametrize("tail", [
    "", "nothing", "message:send/", "tasks/", "tasks/:cancel", "tasks/:subscribe",
    "tasks/..", "tasks/.", "../message:send", "a/b/c/message:send", "tasks/x/other",
    "tasks/x/pushNotificationConfigs/", "tasks/x/pushNotificationConfigs/c/d",
    ".", "..", "v1", "tasks/x/../message:send", "t/v1/./message:send",
])
def test_other_paths_are_no_route(tail):
    assert route_of(tail) is None


def test_wrong_method_names_the_allowed_ones():
    route = route_of("tasks/t/pushNotificationConfigs")
    assert route.method("DELETE") is None and route.allow == "POST, GET"


def test_forwarded_path_keeps_the_callers_encoding_and_query():
    scope = {"raw_path": b"/a2a/ag/tasks/a%20b", "query_string": b"x=1&y=%2F"}
    assert forwarded_path(scope, "ag", "tasks/a b") == "/tasks/a%20b?x=1&y=%2F"
    # No raw path (or one that does not match the decoded path): encoded from the decoded one.
    assert forwarded_path({"query_string": b""}, "ag", "tasks/a b") == "/tasks/a%20b"
    assert forwarded_path({"raw_path": b"/a2a/other/x"}, "ag", "tasks/t") == "/tasks/t"
    # A raw path that decodes to another path than the decoded one: encoded from the latter.
    assert forwarded_path({"raw_path": b"/a2a/ag/tasks/a%2Fb"}, "ag", "tasks/a b") \
        == "/tasks/a%20b"
    assert forwarded_path({"raw_path": b"/a2a/ag/tasks/u"}, "ag", "tasks/t") == "/tasks/t"
    assert forwarded_path({"raw_path": b"/a2a/agx/tasks/t"}, "ag", "x/tasks/t") == "/x/tasks/t"
    # A query holding a byte a request line cannot carry is refused; so is a path beyond ASCII
    # or holding a space, a control or DEL, however it arrived.
    assert forwarded_path({"query_string": b"a=\x01"}, "ag", "tasks") is None
    assert forwarded_path({"raw_path": b"/a2a/ag/tasks/\xc3\xa9"}, "ag", "tasks/\xc3\xa9") is None
    assert forwarded_path({"query_string": b"a=\x7f"}, "ag", "tasks") is None
    assert forwarded_path({"query_string": b"a= b"}, "ag", "tasks") is None
    assert forwarded_path({"query_string": b"a=~!"}, "ag", "tasks") == "/tasks?a=~!"
