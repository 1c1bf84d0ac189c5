from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"
    verbose_name = "A2A gateway"

    def ready(self) -> None:
        from config import node
        from gateway import replicator, runtime
        from registry import events

        # Registry changes reach the gateway through the one event hook (no Django signals).
        events.subscribe(replicator.on_registry_event)
        # The Subscriber Manager and the routing table live as long as the node.
        node.on_startup(runtime.start_node)
        node.on_shutdown(runtime.stop_node)
