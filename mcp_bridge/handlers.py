"""What the node's MCP server answers (:mod:`mcp_bridge.server` is its HTTP edge): the
handlers the SDK's low-level server calls once a request is authenticated -- ``tools/list``
(the agents the caller may call, pinned to a discovery snapshot or ranked by ``?q=``),
``tools/call`` (through the gateway's own handler in-process, :mod:`mcp_bridge.calls`; a
cancelled call cancels its A2A task) and ``subscriptions/listen`` (the 2026-07-28 notification
stream) -- and :func:`build_server`, the server that routes to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any
from urllib.parse import parse_qsl

import mcp_types as types
from django.conf import settings
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY

from core import outage
from gateway import inprocess, runtime
from mcp_bridge import calls, notify, pins, tools
from registry.ids import AGENT_KEY_RE
from registry.permissions import Actor

logger = logging.getLogger(__name__)

#: Where the edge (:mod:`mcp_bridge.server`) leaves the authenticated caller in the scope.
ACTOR_KEY = "a2a.actor"
AUTHORIZATION_KEY = "a2a.authorization"
#: Room above the response cap for the reply's JSON-RPC envelope.
_REPLY_SLACK = 64 * 1024
#: The longest ``?q=`` text (as ARD's ``query.text``).
MAX_QUERY_CHARS = 2000
#: The longest a cancelled call's ``tasks/cancel`` may take.
CANCEL_TIMEOUT_SECONDS = 30.0

INSTRUCTIONS = (
    "Each tool is an A2A agent of this registry, called through its gateway: send it a "
    "message (and the context_id of an earlier answer to continue a conversation). A task "
    "that is still running returns its task_id: poll it with get_task."
)


def _caller(ctx: Any) -> tuple[Actor, str | None]:
    scope = ctx.request.scope if ctx.request is not None else {}
    actor = scope.get(ACTOR_KEY)
    if actor is None:  # only requests that passed mcp_app's authentication reach the SDK
        raise MCPError(types.INVALID_REQUEST, "not authenticated")
    return actor, scope.get(AUTHORIZATION_KEY)


async def _pinned(ctx: Any, actor: Actor) -> pins.Pinned | None:
    """The discovery snapshot the request's URL pins (``?session=`` / ``?snapshot=``)."""
    try:
        return await pins.pinned(ctx.request.scope.get("query_string") or b"", actor.client_id,
                                 actor.tenant)
    except pins.PinError as exc:
        _probe_if_down()
        raise MCPError(types.INVALID_PARAMS, str(exc)) from exc


def _query_text(ctx: Any) -> str | None:
    """The text of ``/mcp?q=<text>`` (tools ranked by it), None without one."""
    raw = (ctx.request.scope.get("query_string") or b"") if ctx.request is not None else b""
    text = next((v for k, v in parse_qsl(raw.decode("latin-1")) if k == "q"), None)
    if text is None or not text.strip():
        return None
    if len(text) > MAX_QUERY_CHARS:
        raise MCPError(types.INVALID_PARAMS, f"q is longer than {MAX_QUERY_CHARS} characters")
    return text.strip()


def _probe_if_down() -> None:
    """A read found the database down (and tripped the outage breaker): make sure the probe
    that closes the breaker runs (``core.outage``)."""
    if outage.breaker.is_open:
        outage.breaker.ensure_probe()


async def current_node():
    return runtime.current_node() or await runtime.host.ensure()


async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None
                     ) -> types.ListToolsResult:
    actor, _ = _caller(ctx)
    node = await current_node()
    pinned = await _pinned(ctx, actor)
    routes = tools.callable_routes(node.table.routes(), actor)
    if pinned is not None:
        routes = [r for r in routes if r.agent_id in pinned.descriptions]
    text = _query_text(ctx)
    listed_routes = routes
    if text is not None and routes:
        try:
            listed_routes = await tools.routes_ranked(routes, text)
        except tools.Unavailable as exc:
            _probe_if_down()
            raise MCPError(types.INTERNAL_ERROR, str(exc)) from exc
    chunk, next_cursor = tools.page(listed_routes, params.cursor if params else None,
                                    ranked=text is not None)
    # While the database is down: from memory (cards read before; unread ones by id alone).
    listed = [types.Tool(**tool) for tool in await tools.tools_listed(
        chunk, pinned.descriptions if pinned is not None else None)]
    _probe_if_down()
    if routes and not (params and params.cursor):
        listed.append(types.Tool(name=tools.GET_TASK, title="Get an A2A task",
                                 description=tools.GET_TASK_DESCRIPTION,
                                 input_schema=tools.GET_TASK_SCHEMA))
    return types.ListToolsResult(tools=listed, next_cursor=next_cursor)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    actor, authorization = _caller(ctx)
    node = await current_node()
    arguments = params.arguments or {}
    name = params.name
    if name == tools.GET_TASK:
        agent_id, task_id = arguments.get("agent_id"), arguments.get("task_id")
        if not isinstance(agent_id, str) or not isinstance(task_id, str) or not task_id:
            return calls.error_result("get_task needs agent_id and task_id (strings)")
        name = agent_id
    pinned = await _pinned(ctx, actor)
    route = node.table.get(name) if AGENT_KEY_RE.match(name) else None
    if route is None or route.credential_passthrough or not actor.may_call(name, route) \
            or (pinned is not None and name not in pinned.descriptions):
        # The same answer for an agent that does not exist and one this caller may not see.
        if params.name == tools.GET_TASK:
            return calls.error_result(f"unknown agent: {name}")
        raise MCPError(types.INVALID_PARAMS, f"unknown tool: {name}")
    try:
        tool = await tools.tool_of(route)
    except tools.Unavailable as exc:
        _probe_if_down()
        return calls.error_result(str(exc), agent_id=name, kind="registry_unavailable",
                                  executed=False, retryable=True)
    if tool is None:
        raise MCPError(types.INVALID_PARAMS, f"unknown tool: {name}")
    streaming = tool.streaming and params.name != tools.GET_TASK
    try:
        if params.name == tools.GET_TASK:
            body, extra = calls.get_task_request(tool.protocol, arguments["task_id"])
        else:
            body, extra = calls.send_request(tool.protocol, arguments, streaming=streaming,
                                             files=calls.FileLimits(
                                                 tool.file_modes, settings.A2A_MCP_MAX_FILES,
                                                 settings.A2A_MCP_MAX_FILE_BYTES))
    except calls.InvalidArguments as exc:
        return calls.error_result(f"invalid arguments: {exc}")
    headers = _headers(authorization, extra)
    client = tuple(ctx.request.scope.get("client") or ("127.0.0.1", 0))
    cap = node.settings.A2A_MAX_RESPONSE_BYTES + _REPLY_SLACK
    if not streaming:
        reply = await inprocess.call(node, name, body, headers=headers, max_bytes=cap,
                                     client=client)
        return calls.tool_result(name, reply, node.settings.A2A_MAX_RESPONSE_BYTES)

    async def progress(count: float, message: str) -> None:
        await ctx.session.report_progress(count, None, message)

    # A stream has no gateway timeout (only an idle one): a tool call ends, answered or not,
    # after the gateway's default timeout; and when the events it keeps outgrow the response
    # cap. Either way the gateway closes the agent's stream (the call task is cancelled, as a
    # caller leaving) and the A2A task is cancelled.
    stream = calls.EventStream(cap, progress)
    call = asyncio.ensure_future(inprocess.call(node, name, body, headers=headers,
                                                max_bytes=cap, client=client, sink=stream))
    stream.on_too_large = call.cancel
    limit = node.settings.A2A_DEFAULT_TIMEOUT_SECONDS
    timed_out = False
    try:
        async with asyncio.timeout(limit):
            reply = await asyncio.shield(call)
    except TimeoutError:
        timed_out = True
    except asyncio.CancelledError:
        call.cancel()
        if not stream.too_large:
            # The MCP client cancelled the call (it closed the response).
            if stream.task_id:
                _cancel_task(node, name, tool.protocol, str(stream.task_id), authorization,
                             client)
            raise
    if timed_out or stream.too_large:
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        if stream.task_id:
            _cancel_task(node, name, tool.protocol, str(stream.task_id), authorization, client)
        if timed_out:
            return calls.error_result(
                f"gateway error (timeout): {name} did not finish within {limit:g} s "
                "(A2A_DEFAULT_TIMEOUT_SECONDS); its task was cancelled", agent_id=name,
                kind="timeout", executed=True, task_id=stream.task_id)
        return stream.result(name, inprocess.Reply(0, {}, b"", False))
    return stream.result(name, reply)


def _headers(authorization: str | None, extra: list) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"application/json"), *extra]
    if authorization:
        headers.append((b"authorization", authorization.encode("latin-1")))
    return headers


_cancels: set[asyncio.Task] = set()


def _cancel_task(node, agent_id: str, protocol: str, task_id: str,
                 authorization: str | None, client: tuple) -> None:
    """Send the agent ``tasks/cancel`` (``CancelTask``) through the gateway, in a task of its
    own (the cancelled call's cannot await any more), bounded by :data:`CANCEL_TIMEOUT_SECONDS`."""
    body, extra = calls.cancel_request(protocol, task_id)

    async def cancel() -> None:
        try:
            reply = await asyncio.wait_for(inprocess.call(
                node, agent_id, body, headers=_headers(authorization, extra),
                max_bytes=_REPLY_SLACK, client=client), CANCEL_TIMEOUT_SECONDS)
        except (TimeoutError, OSError) as exc:
            logger.warning("task %s of %s not cancelled: %r", task_id, agent_id, exc)
            return
        logger.info("task %s of %s cancelled by its MCP client: HTTP %d", task_id, agent_id,
                    reply.status)

    task = asyncio.get_running_loop().create_task(cancel())
    _cancels.add(task)
    task.add_done_callback(_cancels.discard)


def _no_header_params(name: str) -> None:
    """No tool declares ``Mcp-Param-*`` headers, so a call has none to validate. Without this
    the SDK would run the whole ``tools/list`` (a database read) before every 2026-07-28
    ``tools/call`` to find the tool's schema."""
    return None


async def listen(ctx: Any, params: types.SubscriptionsListenRequestParams
                 ) -> types.SubscriptionsListenResult:
    """``subscriptions/listen`` (2026-07-28): this request's response is the stream of the
    caller's ``notifications/tools/list_changed`` (:mod:`mcp_bridge.notify`), on any node."""
    actor, authorization = _caller(ctx)
    node = await current_node()
    pinned = await _pinned(ctx, actor)
    meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
    wanted = bool(params.notifications.tools_list_changed)
    try:
        listener = notify.notifier.open(node, actor, authorization, None if pinned is None
                                        else frozenset(pinned.descriptions))
    except notify.Full as exc:
        raise MCPError(types.INTERNAL_ERROR, str(exc)) from exc
    try:
        await ctx.session.send_notification(types.SubscriptionsAcknowledgedNotification(
            params=types.SubscriptionsAcknowledgedNotificationParams(
                notifications=types.SubscriptionFilter(tools_list_changed=True if wanted else None),
                _meta=meta)), related_request_id=ctx.request_id)

        async def write(frame: bytes | None) -> None:
            # Keepalives are the SDK's (a comment after 15 s without a frame).
            if frame is not None and wanted:
                await ctx.session.send_notification(types.ToolListChangedNotification(
                    params=types.NotificationParams(_meta=meta)),
                    related_request_id=ctx.request_id)

        await notify.notifier.run(listener, node.tokens, write)
    finally:
        notify.notifier.close(listener)
    return types.SubscriptionsListenResult(_meta=meta)


class _Server(Server):
    """The SDK's low-level server, announcing ``tools.listChanged`` to handshake-era clients
    too (the 2026-07-28 capability follows from serving ``subscriptions/listen``)."""

    def create_initialization_options(self, notification_options: Any = None,
                                      *args: Any, **kwargs: Any) -> Any:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True), *args, **kwargs)


def build_server() -> Server:
    return _Server("a2a-registry", version="1", title="A2A agent registry",
                   instructions=INSTRUCTIONS, on_list_tools=list_tools, on_call_tool=call_tool,
                   on_subscriptions_listen=listen, get_tool_input_schema=_no_header_params)
