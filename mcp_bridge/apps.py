"""The MCP bridge app: runs the SDK's session manager for as long as the node serves."""

from django.apps import AppConfig


class McpBridgeConfig(AppConfig):
    name = "mcp_bridge"
    verbose_name = "MCP bridge"

    def ready(self) -> None:
        from core import lifecycle as node

        node.on_startup(_start)
        node.on_shutdown(_stop)


# The bridge's module imports the MCP SDK (about a second of CPU): only a serving node needs
# it, and its ASGI application has imported it by the time these run. Every other process
# (manage.py commands, Celery workers) starts without it.
async def _start() -> None:
    from mcp_bridge.server import bridge

    await bridge.start()


async def _stop() -> None:
    from mcp_bridge.server import bridge

    await bridge.stop()
