"""The MCP bridge app: runs the SDK's session manager for as long as the node serves."""

from django.apps import AppConfig


class McpBridgeConfig(AppConfig):
    name = "mcp_bridge"
    verbose_name = "MCP bridge"

    def ready(self) -> None:
        from core import lifecycle as node
        from mcp_bridge.server import bridge

        node.on_startup(bridge.start)
        node.on_shutdown(bridge.stop)
