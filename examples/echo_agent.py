"""A small A2A agent to register and call through the gateway (a2a-sdk, JSON-RPC, streaming).

    .venv/bin/python examples/echo_agent.py [--host 127.0.0.1] [--port 9999]

It answers every message with ``echo: <text>``. A message starting with ``stream`` (e.g.
``stream one two three``) becomes a task whose words arrive one by one as artifact updates
when called with ``message/stream`` (A2A 0.3) or ``SendStreamingMessage`` (1.0). Its card, at
``/.well-known/agent-card.json``, lists one JSON-RPC interface for A2A 1.0 and one for 0.3 at
the same URL, so both method sets work. It prints its URL once it listens.
"""

from __future__ import annotations

import argparse
import asyncio

import uvicorn
from a2a.helpers import new_task, new_text_artifact, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    TaskArtifactUpdateEvent,
    TaskState,
)
from starlette.applications import Starlette


class EchoExecutor(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        text = context.get_user_input()
        if not text.startswith("stream"):
            await event_queue.enqueue_event(
                new_text_message(f"echo: {text}", context_id=context.context_id))
            return
        task_id, context_id = context.task_id, context.context_id
        await event_queue.enqueue_event(new_task(
            task_id, context_id, TaskState.TASK_STATE_SUBMITTED, history=[context.message]))
        updater = TaskUpdater(event_queue, task_id, context_id)
        await updater.start_work()
        words = text.split()[1:] or ["(nothing", "to", "stream)"]
        artifact_id = f"{task_id}-echo"
        for index, word in enumerate(words):
            await asyncio.sleep(0.2)
            await event_queue.enqueue_event(TaskArtifactUpdateEvent(
                task_id=task_id, context_id=context_id, append=index > 0,
                artifact=new_text_artifact(name="echo", text=word + " ", artifact_id=artifact_id),
                last_chunk=index == len(words) - 1))
        await updater.complete(new_text_message(f"echo: {text}", context_id=context_id,
                                                task_id=task_id))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def build_app(url: str) -> Starlette:
    card = AgentCard(
        name="Echo Agent",
        description="Echoes messages; 'stream a b c' streams the words back one by one.",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0"),
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="0.3"),
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="Echo", description="Echoes the input.",
                           tags=["echo"])],
    )
    handler = DefaultRequestHandler(agent_executor=EchoExecutor(),
                                    task_store=InMemoryTaskStore(), agent_card=card)
    routes = create_agent_card_routes(card)
    routes += create_jsonrpc_routes(handler, "/", enable_v0_3_compat=True)
    return Starlette(routes=routes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9999)
    parser.add_argument("--url", help="the URL the card advertises (default: http://HOST:PORT/)")
    args = parser.parse_args()
    url = args.url or f"http://{args.host}:{args.port}/"
    server = uvicorn.Server(uvicorn.Config(build_app(url), host=args.host, port=args.port,
                                           log_level="warning"))

    async def run() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            print(f"Echo agent listening at {url} (card: {url}.well-known/agent-card.json)",
                  flush=True)
        await task

    asyncio.run(run())


if __name__ == "__main__":
    main()
