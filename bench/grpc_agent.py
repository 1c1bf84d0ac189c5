"""The a2a-sdk agent of ``bench/grpc_bench.py``: one process serving the SDK's JSON-RPC
application (uvicorn) and the SDK's gRPC handler (``GrpcHandler`` on a ``grpc.aio`` server) on
one event loop, both in front of one ``DefaultRequestHandler``, so a call costs the agent the same
work whichever binding it arrives on. The executor answers every message with one Message
``ok`` (no task, nothing stored but what the SDK stores itself).

    python -m bench.grpc_agent --http-port 9001 --grpc-port 9002

``GET /.well-known/agent-card.json`` answers the card (one JSONRPC 1.0 interface at ``/``): what
the bench registers on the node, so the gateway reaches the agent by translating gRPC to
JSON-RPC.
"""

from __future__ import annotations

import argparse
import asyncio

import grpc
import uvicorn
from a2a.helpers import new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.grpc_handler import GrpcHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, a2a_pb2_grpc
from starlette.applications import Starlette


class OkExecutor(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        await event_queue.enqueue_event(new_text_message("ok", context_id=context.context_id))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        return None


def build_card(rpc_url: str) -> AgentCard:
    return AgentCard(
        name="gRPC bench agent", description="Answers ok.", version="1.0.0",
        supported_interfaces=[AgentInterface(url=rpc_url, protocol_binding="JSONRPC",
                                             protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=False),
        default_input_modes=["text/plain"], default_output_modes=["text/plain"],
        skills=[AgentSkill(id="ok", name="Ok", description="Answers ok.", tags=["bench"])],
    )


async def serve(http_port: int, grpc_port: int) -> None:
    card = build_card(f"http://127.0.0.1:{http_port}/")
    handler = DefaultRequestHandler(agent_executor=OkExecutor(), task_store=InMemoryTaskStore(),
                                    agent_card=card)
    app = Starlette(routes=[*create_agent_card_routes(card),
                            *create_jsonrpc_routes(handler, "/", enable_v0_3_compat=True)])
    grpc_server = grpc.aio.server()
    a2a_pb2_grpc.add_A2AServiceServicer_to_server(GrpcHandler(handler), grpc_server)
    grpc_server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    await grpc_server.start()
    config = uvicorn.Config(app, host="127.0.0.1", port=http_port, http="httptools",
                            log_level="warning", access_log=False, lifespan="off",
                            timeout_keep_alive=75)
    try:
        await uvicorn.Server(config).serve()
    finally:
        await grpc_server.stop(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    args = parser.parse_args()
    try:
        import uvloop
        uvloop.run(serve(args.http_port, args.grpc_port))
    except ImportError:
        asyncio.run(serve(args.http_port, args.grpc_port))


if __name__ == "__main__":
    main()
