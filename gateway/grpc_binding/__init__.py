"""The A2A gRPC binding of the gateway: a grpcio asyncio listener on the node's event loop
(:mod:`gateway.grpc_binding.server`), each call routed by its ``tenant`` to the agent and
taken the gateway's one way to it (:mod:`gateway.grpc_binding.calls`), translated to and from
the agent's JSON-RPC with the a2a-sdk's own types and converters
(:mod:`gateway.grpc_binding.translate`). docs/gateway.md, "The gRPC binding"."""
