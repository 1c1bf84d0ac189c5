"""Real A2A agents for tests, built with the official ``a2a-sdk`` (1.x) and served by uvicorn.

:class:`EchoAgent` is the SDK's own Starlette JSON-RPC application (``create_jsonrpc_routes``
with ``enable_v0_3_compat=True``, so one endpoint answers the A2A 1.0 method names
``SendMessage``/``SendStreamingMessage``/``GetTask``/``CancelTask`` *and* the 0.3 names
``message/send``/``message/stream``/``tasks/get``/``tasks/cancel``), an
:class:`~a2a.server.request_handlers.DefaultRequestHandler` with an in-memory task store, and
:class:`EchoExecutor`. A tiny ASGI middleware records every HTTP request the agent receives
(path, headers, JSON-RPC method) so tests can assert what arrived at the agent.

The SDK checks the ``A2A-Version`` header: 1.0 method names need ``A2A-Version: 1.x``; 0.3 names
need the header absent or ``0.3``. A proxy that drops the header therefore breaks 1.0 calls.

What the executor does depends on the user's text:

* ``wait ...``  -- a Task that stays ``working`` (bounded, 30 s) until ``tasks/cancel``;
* ``task ...``  -- a Task: submitted, working, ``steps`` artifact chunks ``step_delay`` apart,
  completed. Streamed, every event leaves the agent as it happens, so a caller can observe
  incremental arrival;
* ``parts ...`` -- one Message ``parts: <JSON>``: the parts the agent received, described
  (kind; a file's name, media type and size or URL; a data part's data);
* anything else -- one Message ``echo: <text>``.

Card shapes (``card_shape``), served at ``/.well-known/agent-card.json``:

* ``"1.0"``  -- ``supportedInterfaces`` only (one JSONRPC 1.0 interface, no top-level ``url``);
* ``"0.3"``  -- the 0.3 shape only (``url``, ``protocolVersion``, ``preferredTransport``); SDK
  1.x clients reading it speak the 0.3 method names;
* ``"both"`` -- what the SDK serves for an agent with a 1.0 and a 0.3 interface: the 1.0 card
  with the 0.3 fields merged in.

``push=True`` gives the agent the SDK's push notifications: its in-memory config store and its own
sender (``BasePushNotificationSender``), and ``capabilities.pushNotifications`` in its card.

``extended=True`` gives the agent an extended card (A2A's ``GetExtendedAgentCard``): its card
with one more skill, ``secret``, and ``capabilities.extendedAgentCard`` on.

``interfaces`` overrides the card's interfaces: ``[(binding, version), ...]`` in the agent's
order of preference, e.g. gRPC first. ``JSONRPC`` is served at the agent's RPC path and
``HTTP+JSON`` (1.0 routes, 0.3 under ``/v1/``) under ``/rest``, both for real; ``GRPC`` is listed
at ``127.0.0.1:{grpc_port}`` but not served, so a client that picks it fails, as a client sent to
a binding nobody answers does (the gateway's own gRPC listener is tested with these agents behind
it: tests/gateway/test_grpc_binding.py), until :meth:`EchoAgent.serve_grpc` serves it (the
SDK's own gRPC handler: tests/gateway/test_grpc_passthrough.py).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
import pytest
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.client import client_factory as client_factory_module
from a2a.compat.v0_3 import a2a_v0_3_pb2_grpc as grpc03
from a2a.compat.v0_3.conversions import to_compat_agent_card
from a2a.compat.v0_3.grpc_handler import CompatGrpcHandler
from a2a.helpers import get_message_text, new_task, new_text_artifact, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.grpc_handler import GrpcHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import (
    create_agent_card_routes,
    create_jsonrpc_routes,
    create_rest_routes,
)
from a2a.server.tasks import (
    BasePushNotificationSender,
    InMemoryPushNotificationConfigStore,
    InMemoryTaskStore,
    TaskUpdater,
)
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    CancelTaskRequest,
    GetTaskRequest,
    Role,
    SendMessageRequest,
    StreamResponse,
    TaskArtifactUpdateEvent,
    TaskNotFoundError,
    TaskState,
    a2a_pb2_grpc,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.servers import ThreadedUvicorn, free_port

CARD_SHAPES = ("1.0", "0.3", "both")
JSONRPC_BINDING, HTTP_JSON_BINDING, GRPC_BINDING = "JSONRPC", "HTTP+JSON", "GRPC"
ALL_BINDINGS = [GRPC_BINDING, JSONRPC_BINDING, HTTP_JSON_BINDING]
WAIT_LIMIT_SECONDS = 30.0


@dataclass
class RecordedRequest:
    """One HTTP request as the agent received it."""

    http_method: str
    path: str
    headers: list[tuple[str, str]]
    rpc_method: str | None = None
    body: bytes = b""
    received_at: float = field(default_factory=time.monotonic)

    def header(self, name: str) -> str | None:
        """The first value of a header (case-insensitive), or None."""
        name = name.lower()
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def header_values(self, name: str) -> list[str]:
        name = name.lower()
        return [value for key, value in self.headers if key == name]


class RequestRecorder:
    """ASGI middleware: records each HTTP request (headers, path, JSON-RPC method) in order."""

    def __init__(self, app) -> None:
        self.app = app
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RecordedRequest(
            http_method=scope["method"],
            path=scope["path"],
            headers=[(k.decode("latin-1").lower(), v.decode("latin-1"))
                     for k, v in scope["headers"]],
        )
        with self._lock:
            self.requests.append(record)
        chunks: list[bytes] = []

        async def recording_receive():
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    record.body = b"".join(chunks)
                    try:
                        payload = json.loads(record.body)
                    except ValueError:
                        payload = None
                    if isinstance(payload, dict) and isinstance(payload.get("method"), str):
                        record.rpc_method = payload["method"]
            return message

        await self.app(scope, recording_receive, send)

    def rpc(self, method: str | None = None) -> list[RecordedRequest]:
        """Recorded JSON-RPC requests (POSTs), optionally only those of one method."""
        with self._lock:
            return [r for r in self.requests
                    if r.http_method == "POST" and (method is None or r.rpc_method == method)]

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()


class EchoExecutor(AgentExecutor):
    """Echo agent logic; see the module docstring for the behaviours."""

    def __init__(self, *, steps: int = 4, step_delay: float = 0.2) -> None:
        self.steps = steps
        self.step_delay = step_delay
        self.cancelled: list[str] = []
        self.tenants: list[str] = []  # the request's tenant, per executed message

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.tenants.append(context.tenant)
        text = context.get_user_input()
        task_id, context_id = context.task_id, context.context_id
        if text.startswith("wait"):
            await event_queue.enqueue_event(
                new_task(task_id, context_id, TaskState.TASK_STATE_SUBMITTED,
                         history=[context.message]))
            updater = TaskUpdater(event_queue, task_id, context_id)
            await updater.start_work(new_text_message(f"waiting: {text}", context_id=context_id,
                                                      task_id=task_id))
            # Bounded: the test cancels long before; never leave a task running forever.
            await asyncio.sleep(WAIT_LIMIT_SECONDS)
            await updater.failed(new_text_message("nobody cancelled me", context_id=context_id,
                                                  task_id=task_id))
            return
        if text.startswith("task"):
            await event_queue.enqueue_event(
                new_task(task_id, context_id, TaskState.TASK_STATE_SUBMITTED,
                         history=[context.message]))
            updater = TaskUpdater(event_queue, task_id, context_id)
            await updater.start_work()
            for index in range(self.steps):
                await asyncio.sleep(self.step_delay)
                artifact = new_text_artifact(name="echo", text=f"chunk {index}: {text}")
                await event_queue.enqueue_event(TaskArtifactUpdateEvent(
                    task_id=task_id, context_id=context_id, artifact=artifact,
                    append=False, last_chunk=index == self.steps - 1))
            await updater.complete(new_text_message(f"done: {text}", context_id=context_id,
                                                    task_id=task_id))
            return
        if text.startswith("parts"):
            received = [_described(part) for part in context.message.parts]
            await event_queue.enqueue_event(new_text_message(
                f"parts: {json.dumps(received, sort_keys=True)}", context_id=context_id))
            return
        await event_queue.enqueue_event(
            new_text_message(f"echo: {text}", context_id=context_id))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.cancelled.append(context.task_id)
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel(new_text_message("cancelled", context_id=context.context_id,
                                              task_id=context.task_id))


def _described(part: Any) -> dict[str, Any]:
    """What the agent received in one part (an SDK ``Part``)."""
    kind = part.WhichOneof("content")
    described: dict[str, Any] = {"kind": kind}
    if kind == "text":
        described["text"] = part.text
    elif kind == "raw":
        described.update(filename=part.filename, media_type=part.media_type,
                         size=len(part.raw), head=part.raw[:16].decode("latin-1"))
    elif kind == "url":
        described.update(filename=part.filename, media_type=part.media_type, url=part.url)
    elif kind == "data":
        described["data"] = MessageToDict(part.data)
    return described


def build_card(url: str, *, name: str = "Echo Agent", card_shape: str = "both",
               interfaces: list[AgentInterface] | None = None) -> AgentCard:
    """The agent's card (an SDK ``AgentCard``) with its interfaces for ``card_shape``, or
    ``interfaces`` when given."""
    if card_shape not in CARD_SHAPES:
        raise ValueError(f"card_shape must be one of {CARD_SHAPES}")
    if interfaces is None:
        interfaces = []
        if card_shape in ("1.0", "both"):
            interfaces.append(AgentInterface(url=url, protocol_binding="JSONRPC",
                                             protocol_version="1.0"))
        if card_shape in ("0.3", "both"):
            interfaces.append(AgentInterface(url=url, protocol_binding="JSONRPC",
                                             protocol_version="0.3"))
    return AgentCard(
        name=name,
        description="Echoes messages; streams task progress; cancellable waits.",
        version="1.0.0",
        supported_interfaces=interfaces,
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="Echo", description="Echoes the input.",
                           tags=["echo", "test"])],
    )


def card_json(card: AgentCard, card_shape: str) -> dict[str, Any]:
    """The JSON document served for ``card``: the SDK's own rendering, or the pure 0.3 shape."""
    if card_shape == "0.3":
        return to_compat_agent_card(card).model_dump(mode="json", by_alias=True,
                                                      exclude_none=True)
    return agent_card_to_dict(card)


class EchoAgent:
    """An SDK echo agent on a free loopback port. Use as a context manager or start()/stop()."""

    def __init__(self, *, card_shape: str = "both", name: str = "Echo Agent", steps: int = 4,
                 step_delay: float = 0.2, rpc_path: str = "/",
                 interfaces: list[tuple[str, str]] | None = None,
                 extended: bool = False, push: bool = False) -> None:
        self.card_shape = card_shape
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.rpc_url = f"{self.base_url}{rpc_path}"
        self.rest_url = f"{self.base_url}/rest"
        self.grpc_address = f"127.0.0.1:{free_port()}"  # listed, never served
        where = {"JSONRPC": self.rpc_url, "HTTP+JSON": self.rest_url, "GRPC": self.grpc_address}
        self.card = build_card(self.rpc_url, name=name, card_shape=card_shape, interfaces=None
                               if interfaces is None else [
                                   AgentInterface(url=where[binding], protocol_binding=binding,
                                                  protocol_version=version)
                                   for binding, version in interfaces])
        self.extended_card: AgentCard | None = None
        if extended:
            self.card.capabilities.extended_agent_card = True
            self.extended_card = AgentCard()
            self.extended_card.CopyFrom(self.card)
            self.extended_card.skills.append(AgentSkill(
                id="secret", name="Secret", description="For authenticated callers.",
                tags=["secret"]))
        push_options: dict[str, Any] = {}
        if push:
            # The SDK's own push-notification config store and sender (it presents a config's
            # token in X-A2A-Notification-Token), as an agent offering push would use them.
            self.card.capabilities.push_notifications = True
            store = InMemoryPushNotificationConfigStore()
            push_options = {"push_config_store": store, "push_sender": BasePushNotificationSender(
                httpx.AsyncClient(timeout=10), store)}
        self.card_document = card_json(self.card, card_shape)
        self.executor = EchoExecutor(steps=steps, step_delay=step_delay)
        self.handler = DefaultRequestHandler(
            agent_executor=self.executor, task_store=InMemoryTaskStore(), agent_card=self.card,
            extended_agent_card=self.extended_card, **push_options)

        if card_shape == "0.3":
            # The SDK 1.x renders 1.0 cards (0.3 fields merged in at most); a pure 0.3 agent
            # serves the 0.3 document itself.
            async def serve_card(request: Request) -> JSONResponse:
                return JSONResponse(self.card_document)

            routes = [Route(AGENT_CARD_WELL_KNOWN_PATH, serve_card, methods=["GET"])]
        else:
            routes = create_agent_card_routes(self.card)
        routes += create_jsonrpc_routes(self.handler, rpc_path, enable_v0_3_compat=True)
        if any(binding == "HTTP+JSON" for binding, _ in interfaces or []):
            routes += create_rest_routes(self.handler, enable_v0_3_compat=True,
                                         path_prefix="/rest")
        self.recorder = RequestRecorder(Starlette(routes=routes))
        self._server: ThreadedUvicorn | None = None
        self.grpc_calls: list[tuple[str, dict[str, Any]]] = []

    @property
    def url(self) -> str:
        """The agent's JSON-RPC endpoint (what its card advertises)."""
        return self.rpc_url

    @property
    def requests(self) -> list[RecordedRequest]:
        return list(self.recorder.requests)

    async def serve_grpc(self, version: str = "1.0") -> grpc.aio.Server:
        """Serve the SDK's own gRPC handler (``GrpcHandler``, the A2A 1.0 service; for
        ``version="0.3"`` its ``CompatGrpcHandler``, the 0.3 service) at :attr:`grpc_address`,
        on the running event loop; every call's method path and metadata are kept in
        :attr:`grpc_calls`. The caller stops the server it gets."""
        calls = self.grpc_calls

        class Recording(grpc.aio.ServerInterceptor):
            async def intercept_service(self, continuation, details):
                calls.append((details.method, dict(details.invocation_metadata or ())))
                return await continuation(details)

        server = grpc.aio.server(interceptors=[Recording()])
        if version == "0.3":
            grpc03.add_A2AServiceServicer_to_server(CompatGrpcHandler(self.handler), server)
        else:
            a2a_pb2_grpc.add_A2AServiceServicer_to_server(GrpcHandler(self.handler), server)
        server.add_insecure_port(self.grpc_address)
        await server.start()
        return server

    def start(self) -> EchoAgent:
        self._server = ThreadedUvicorn(self.recorder, port=self.port, lifespan="off").start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> EchoAgent:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextmanager
def running_echo_agent(**kwargs) -> Iterator[EchoAgent]:
    with EchoAgent(**kwargs) as agent:
        yield agent


# --- SDK client helpers ----------------------------------------------------------------------


def client_factory(config: ClientConfig, bindings: list[str]) -> ClientFactory:
    """The SDK's ``ClientFactory`` accepting ``bindings`` (in the client's order of preference).

    The SDK builds a gRPC transport only with grpcio installed (a dependency of the project
    since its gRPC listener): without it a client accepting ``GRPC`` gets a stand-in that fails
    when the client picks gRPC (its message names the address), as a real one does at its first
    call to a gRPC address that nothing serves.
    """
    grpc_stand_in = GRPC_BINDING in bindings and client_factory_module.GrpcTransport is None
    config.supported_protocol_bindings = [b for b in bindings
                                          if not (grpc_stand_in and b == GRPC_BINDING)]
    factory = ClientFactory(config)
    if grpc_stand_in:
        def no_grpc(card, url: str, config: ClientConfig):
            raise ValueError(f"gRPC at {url}: no gRPC transport installed")

        factory.register(GRPC_BINDING, no_grpc)
        config.supported_protocol_bindings = list(bindings)
    return factory


def _with_metadata(details, metadata: list[tuple[str, str]]):
    return details._replace(metadata=[*(details.metadata or ()), *metadata])


class _UnaryMetadata(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, metadata: list[tuple[str, str]]) -> None:
        self.metadata = metadata

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(_with_metadata(client_call_details, self.metadata), request)


class _StreamMetadata(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, metadata: list[tuple[str, str]]) -> None:
        self.metadata = metadata

    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(_with_metadata(client_call_details, self.metadata), request)


def grpc_channel_factory(metadata: dict[str, str] | None = None):
    """An SDK ``grpc_channel_factory``: an insecure channel to the card's ``host:port`` whose
    every call carries ``metadata`` (the bearer token, say), as ``headers`` go on every HTTP
    request of :func:`sdk_client`."""
    pairs = [(k.lower(), v) for k, v in (metadata or {}).items()]
    interceptors = [_UnaryMetadata(pairs), _StreamMetadata(pairs)] if pairs else None
    return lambda url: grpc.aio.insecure_channel(url, interceptors=interceptors)


@asynccontextmanager
async def sdk_client(base_url: str, *, streaming: bool = True, polling: bool = False,
                     headers: dict[str, str] | None = None, timeout: float = 30.0,
                     responses: list[httpx.Response] | None = None,
                     bindings: list[str] | None = None,
                     client_preference: bool = False,
                     grpc_metadata: dict[str, str] | None = None) -> AsyncIterator[Client]:
    """A stock a2a-sdk client resolved from ``base_url``'s well-known card, the way a user would.

    ``headers`` go on every request (card fetch included): bearer tokens, custom ``X-`` headers.
    ``responses``, when given, collects every HTTP response (headers available as they arrive).
    ``bindings``: the protocol bindings the client accepts (the SDK's default: JSON-RPC only),
    taken in the card's order, or in the client's own with ``client_preference``
    (:func:`client_factory`). A gRPC interface is reached over an insecure channel carrying
    ``grpc_metadata`` on every call (``{"authorization": "Bearer ..."}``).
    """
    hooks = {}
    if responses is not None:
        async def keep(response: httpx.Response) -> None:
            responses.append(response)

        hooks["response"] = [keep]
    async with httpx.AsyncClient(headers=headers or {}, timeout=timeout,
                                 event_hooks=hooks) as http:
        config = ClientConfig(httpx_client=http, streaming=streaming, polling=polling,
                              use_client_preference=client_preference,
                              grpc_channel_factory=grpc_channel_factory(grpc_metadata))
        factory = client_factory(config, bindings or [JSONRPC_BINDING])
        client = await factory.create_from_url(base_url)
        try:
            yield client
        finally:
            await client.close()


def user_message(text: str) -> SendMessageRequest:
    return SendMessageRequest(message=new_text_message(text, role=Role.ROLE_USER))


@dataclass
class Arrival:
    """One streamed event and when the caller got it (seconds since the call started)."""

    at: float
    kind: str
    event: StreamResponse


async def send_and_collect(client: Client, text: str) -> list[Arrival]:
    """Send ``text``; every event the client yields, with its arrival time, in order."""
    started = time.monotonic()
    arrivals = []
    async for event in client.send_message(user_message(text)):
        arrivals.append(Arrival(time.monotonic() - started, event.WhichOneof("payload"), event))
    return arrivals


async def echo_get_and_cancel(client: Client,
                              not_found: type[Exception] = TaskNotFoundError) -> str:
    """The echo agent's calls an SDK client makes through the gateway on every binding: a
    message echoed, a task started, read (working) and cancelled, and an unknown task read
    (the SDK raises ``not_found``). The cancelled task's id."""
    [reply] = await send_and_collect(client, "hello")
    assert reply.kind == "message" and get_message_text(reply.event.message) == "echo: hello"
    [first] = await send_and_collect(client, "wait for cancel")
    task_id: str = first.event.task.id
    got = await client.get_task(GetTaskRequest(id=task_id))
    assert (got.id, got.status.state) == (task_id, TaskState.TASK_STATE_WORKING)
    cancelled = await client.cancel_task(CancelTaskRequest(id=task_id))
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
    with pytest.raises(not_found):
        await client.get_task(GetTaskRequest(id="no-such-task"))
    return task_id


def transport_name(client: Client) -> str:
    """Which SDK transport the client chose from the card (JsonRpcTransport: 1.0 names,
    CompatJsonRpcTransport: 0.3 names)."""
    return type(getattr(client, "_transport", None)).__name__


# --- pytest fixtures (import them into a conftest.py) ----------------------------------------


@pytest.fixture
def echo_agent_factory() -> Iterator[Callable[..., EchoAgent]]:
    """Start SDK echo agents on free ports: ``echo_agent_factory(card_shape="0.3")``.
    All are stopped at the end of the test."""
    started: list[EchoAgent] = []

    def factory(**kwargs) -> EchoAgent:
        kwargs.setdefault("step_delay", 0.15)
        agent = EchoAgent(**kwargs).start()
        started.append(agent)
        return agent

    yield factory
    for agent in started:
        agent.stop()


@pytest.fixture
def echo_agent(echo_agent_factory) -> EchoAgent:
    """One SDK echo agent whose card offers both a 1.0 and a 0.3 JSONRPC interface."""
    return echo_agent_factory(card_shape="both")
