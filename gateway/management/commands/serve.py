"""python manage.py serve [--host H] [--port P] [--server daphne|uvicorn]: run one node."""

from __future__ import annotations

import asyncio
import logging
import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from config import node

logger = logging.getLogger(__name__)


def _bootstrap_admin_client(stdout) -> None:
    """On the first start of an empty embedded database, create an admin client once."""
    from registry import services
    from registry.models import ApiClient

    if not settings.EMBEDDED or ApiClient.objects.exists():
        return
    client, token = services.api_client_create(name="bootstrap-admin", scopes=["admin"])
    stdout.write(
        "\nCreated the bootstrap admin API client (shown once; store it now):\n"
        f"  Authorization: Bearer {token}\n"
        "Create more with: python manage.py create_client NAME --scopes register,call\n"
    )


class Command(BaseCommand):
    help = "Serve one node: the ASGI app (gateway, API, admin), the Subscriber Manager, and in " \
           "embedded mode the periodic jobs."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--server", choices=["daphne", "uvicorn"], default="daphne")
        parser.add_argument(
            "--no-periodic", action="store_true",
            help="do not run the periodic jobs in-process (embedded mode runs them by default)",
        )

    def handle(self, *args, host: str, port: int, server: str, no_periodic: bool, **options):
        from django.db import connection
        from django.db.migrations.executor import MigrationExecutor

        try:
            executor = MigrationExecutor(connection)
            pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
        except Exception as exc:
            raise CommandError(f"database not reachable: {exc}") from None
        if pending:
            raise CommandError("database has unapplied migrations: run manage.py migrate first")
        if not os.environ.get("NODE_ID"):
            import socket

            node.serve_as(f"{socket.gethostname()}:{port}")
        _bootstrap_admin_client(self.stdout)
        connection.close()
        periodic = settings.EMBEDDED and not no_periodic
        mode = "embedded" if settings.EMBEDDED else "distributed"
        self.stdout.write(
            f"Node {node.node_id()} ({mode}) serving on http://{host}:{port}/ with {server}"
            f"{' and in-process periodic jobs' if periodic else ''}. Ctrl-C stops it."
        )
        self.stdout.flush()
        if server == "uvicorn":
            self._uvicorn(host, port, periodic)
        else:
            self._daphne(host, port, periodic)

    def _uvicorn(self, host: str, port: int, periodic: bool) -> None:
        import uvicorn

        from config.asgi import application

        if periodic:
            node.on_startup(_start_periodic)
            node.on_shutdown(_stop_periodic)
        uvicorn.run(
            application, host=host, port=port, loop="uvloop", http="httptools",
            lifespan="on", log_level="warning", access_log=False,
            timeout_graceful_shutdown=5,
            # X-Forwarded-* are believed only from A2A_TRUSTED_PROXIES (gateway.cards), not
            # from whatever uvicorn's own default (127.0.0.1) trusts.
            proxy_headers=False,
        )

    def _daphne(self, host: str, port: int, periodic: bool) -> None:
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server

        from config.asgi import application

        if periodic:
            node.on_startup(_start_periodic)
            node.on_shutdown(_stop_periodic)

        def ready() -> None:
            asyncio.get_event_loop().create_task(node.start())

        server = Server(
            application=application,
            endpoints=build_endpoint_description_strings(host=host, port=port),
            ready_callable=ready,
            http_timeout=None,
            websocket_timeout=None,
            application_close_timeout=10,
            verbosity=0,
        )
        # Daphne has no lifespan protocol: stop the node's hooks when the reactor stops.
        from twisted.internet import reactor

        reactor.addSystemEventTrigger(
            "before", "shutdown", lambda: asyncio.ensure_future(node.stop())
        )
        server.run()


_periodic_tasks: list[asyncio.Task] = []


async def _start_periodic() -> None:
    from config.periodic import start_periodic_tasks

    _periodic_tasks.extend(start_periodic_tasks())


async def _stop_periodic() -> None:
    for task in _periodic_tasks:
        task.cancel()
    _periodic_tasks.clear()
