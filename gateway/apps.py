"""The gateway app: subscribes the process to registry events and registers its node's hooks."""

from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"
    verbose_name = "A2A gateway"

    def ready(self) -> None:
        from core import lifecycle as node
        from core import tracing
        from gateway import replicator, runtime
        from gateway import tracing as gateway_tracing
        from registry import events

        # Registry changes reach the gateway through the one event hook (no Django signals):
        # a running node subscribes itself; without one, events are only announced.
        events.subscribe(replicator.announce_without_node)
        # The node (routing table, Subscriber Manager, ...) lives as long as the server.
        node.on_startup(runtime.host.start)
        node.on_shutdown(runtime.host.stop)
        # Tracing (set up by the registry app, first) switches the hot path's spans on and off.
        tracing.on_tracer(gateway_tracing.enable, gateway_tracing.disable)
        # The gRPC listener (off unless configured) serves from the node started above, and
        # stops first (shutdown hooks run in reverse), and stops taking calls at the drain.
        from gateway.grpc_binding import server as grpc_server

        node.on_startup(grpc_server.start)
        node.on_shutdown(grpc_server.stop)
        node.on_drain(grpc_server.drain)
