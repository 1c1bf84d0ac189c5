"""The a2a-sdk agent the A2A TCK (github.com/a2aproject/a2a-tck) runs against, directly and
through a node (``bench/tck_run.py``): the SDK's JSON-RPC application at ``/``, its HTTP+JSON
routes under ``/rest`` and its gRPC handler (``GrpcHandler`` on a ``grpc.aio`` server), one event
loop, one ``DefaultRequestHandler`` with an in-memory task store.

The executor behaves as the TCK's own Python SUT (``python-sut/tck_core_agent``), ported to the
SDK 1.x: a task per message, ``submitted`` then ``working`` (0.5 s each), one artifact with the
answer, ``completed`` with the answer as its status message; cancellable while it runs. A message
whose id starts with ``test-resubscribe-message-id`` keeps its task running for
``2 x TCK_STREAMING_TIMEOUT`` (the TCK's requirement for its resubscribe tests).

    python -m bench.tck_agent --http-port 9001 --grpc-port 9002

``GET /.well-known/agent-card.json`` answers the card: JSONRPC, HTTP+JSON and GRPC interfaces,
all A2A 1.0.
"""

from __future__ import annotations

import argparse
import asyncio
import os

import grpc
import uvicorn
from a2a.helpers import new_task, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.grpc_handler import GrpcHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Part,
    TaskState,
    a2a_pb2_grpc,
)
from starlette.applications import Starlette

STEP_SECONDS = 0.5
RESUBSCRIBE_PREFIX = "test-resubscribe-message-id"


def answer(query: str) -> str:
    """The TCK core agent's answers."""
    lowered = query.lower()
    if not query.strip():
        return "Hello! Please provide a message for me to respond to."
    if "hello" in lowered or "hi" in lowered:
        return "Hello World! Nice to meet you!"
    if "how are you" in lowered:
        return "I'm doing great! Thanks for asking. How can I help you today?"
    if "goodbye" in lowered or "bye" in lowered:
        return "Goodbye! Have a wonderful day!"
    return f"Hello World! You said: '{query}'. Thanks for your message!"


class TckExecutor(AgentExecutor):
    def __init__(self) -> None:
        self.running: set[str] = set()

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id = context.task_id, context.context_id
        if context.current_task is None:
            await event_queue.enqueue_event(new_task(
                task_id, context_id, TaskState.TASK_STATE_SUBMITTED, history=[context.message]))
        updater = TaskUpdater(event_queue, task_id, context_id)
        self.running.add(task_id)
        try:
            await updater.update_status(TaskState.TASK_STATE_SUBMITTED)
            await asyncio.sleep(STEP_SECONDS)
            if task_id not in self.running:
                return
            await updater.start_work()
            message_id = context.message.message_id if context.message else ""
            if message_id.startswith(RESUBSCRIBE_PREFIX):
                await asyncio.sleep(2 * float(os.environ.get("TCK_STREAMING_TIMEOUT", "2.0")))
            else:
                await asyncio.sleep(STEP_SECONDS)
            if task_id not in self.running:
                return
            text = answer(context.get_user_input())
            await updater.add_artifact([Part(text=text)], name="response", last_chunk=True)
            await updater.complete(new_text_message(text, context_id=context_id,
                                                    task_id=task_id))
        finally:
            self.running.discard(task_id)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.running.discard(context.task_id)
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel(new_text_message("cancelled", context_id=context.context_id,
                                              task_id=context.task_id))


def build_card(http_port: int, grpc_port: int) -> AgentCard:
    base = f"http://127.0.0.1:{http_port}"
    return AgentCard(
        name="TCK Core Agent", version="1.0.0",
        description="The a2a-sdk agent the A2A TCK runs against.",
        supported_interfaces=[
            AgentInterface(url=f"{base}/", protocol_binding="JSONRPC", protocol_version="1.0"),
            AgentInterface(url=f"{base}/rest", protocol_binding="HTTP+JSON",
                           protocol_version="1.0"),
            AgentInterface(url=f"127.0.0.1:{grpc_port}", protocol_binding="GRPC",
                           protocol_version="1.0"),
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text"], default_output_modes=["text"],
        skills=[AgentSkill(id="tck_core_agent", name="TCK Core Agent", tags=["tck"],
                           description="Answers hello.", examples=["hi", "hello world"])],
    )


async def serve(http_port: int, grpc_port: int) -> None:
    card = build_card(http_port, grpc_port)
    handler = DefaultRequestHandler(agent_executor=TckExecutor(),
                                    task_store=InMemoryTaskStore(), agent_card=card)
    app = Starlette(routes=[*create_agent_card_routes(card),
                            *create_jsonrpc_routes(handler, "/"),
                            *create_rest_routes(handler, path_prefix="/rest")])
    grpc_server = grpc.aio.server()
    a2a_pb2_grpc.add_A2AServiceServicer_to_server(GrpcHandler(handler), grpc_server)
    grpc_server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    await grpc_server.start()
    config = uvicorn.Config(app, host="127.0.0.1", port=http_port, log_level="warning",
                            access_log=False, lifespan="off")
    try:
        await uvicorn.Server(config).serve()
    finally:
        await grpc_server.stop(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.http_port, args.grpc_port))


if __name__ == "__main__":
    main()
