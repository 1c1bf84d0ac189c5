"""The A2A gRPC binding of the gateway: a grpcio asyncio listener on the node's event loop
(:mod:`gateway.grpc_binding.server`), each call routed by its ``tenant`` to the agent and
either passed through to the agent's own gRPC server when its card lists one of the caller's
protocol version (:mod:`gateway.grpc_binding.passthrough`), or taken the gateway's one way to it
(:mod:`gateway.grpc_binding.calls`), translated to and from the agent's JSON-RPC with the
a2a-sdk's own types and converters (:mod:`gateway.grpc_binding.translate`). An agent that serves
only gRPC gets its JSON-RPC and HTTP+JSON calls (and gRPC calls of the other protocol version)
translated to its gRPC server (:mod:`gateway.grpc_binding.outbound_translate`, its conversions
in :mod:`gateway.grpc_binding.outbound_messages`). docs/gateway.md, "The gRPC binding"."""
