"""python manage.py serve [--host H] [--port P] [--server uvicorn|daphne] [--grpc-port G]:
run one node.

A node is one server process: the ASGI application (gateway, API, admin), the Subscriber
Manager, in embedded mode the periodic jobs, and with ``--grpc-port`` (or ``A2A_GRPC_PORT``) the
gateway's gRPC listener on the same event loop. Both servers get the same connection and body
limits (:mod:`node.servers`) and the same startup and shutdown hooks (:mod:`core.lifecycle`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from core import lifecycle as node
from node.servers import BACKLOG, PortInUse, ServerLimits, bind_socket

logger = logging.getLogger(__name__)

SERVERS = ("daphne", "uvicorn")
#: Daphne, the Channels server, as the design names it. Both servers refuse an over-cap or
#: unauthenticated upload before reading it (node.servers); uvicorn is about twice as fast.
DEFAULT_SERVER = "daphne"


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


def _one_line(exc: BaseException) -> str:
    """A driver error on one line (psycopg's span several), so the cause is the last line."""
    text = " ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _check_database() -> None:
    """Fail fast, naming the cause, when the database is missing or not migrated."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    where = connection.settings_dict.get("NAME")
    if connection.vendor == "postgresql":
        # A direct connection with a short timeout: the pool would retry for its whole timeout.
        import psycopg

        params = connection.get_connection_params()
        params.pop("pool", None)
        params["connect_timeout"] = 5
        host = params.get("host") or "localhost"
        where = f"{host}:{params.get('port') or 5432}/{params.get('dbname')}"
        try:
            psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"}).close()
        except Exception as exc:
            raise CommandError(f"database not reachable ({where}): {_one_line(exc)}") from None
    try:
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Exception as exc:
        raise CommandError(f"database not reachable ({where}): {_one_line(exc)}") from None
    finally:
        connection.close()
    if pending:
        raise CommandError("database has unapplied migrations: run manage.py migrate first")


class Command(BaseCommand):
    help = (
        "Serve one node: the ASGI app (gateway, API, admin), the Subscriber Manager, and the "
        "periodic jobs (embedded: all; distributed: A2A_NODE_PERIODIC_TASKS, expiry by default, "
        "under a cluster-wide lock). Refuses to start when the port is taken or the "
        "database is unreachable or not migrated."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--host",
            default="127.0.0.1",
            help="address to listen on (default: %(default)s; 0.0.0.0 for all)",
        )
        parser.add_argument(
            "--port", type=int, default=8000, help="TCP port to listen on (default: %(default)s)"
        )
        parser.add_argument(
            "--server",
            choices=SERVERS,
            default=DEFAULT_SERVER,
            help="ASGI server (default: %(default)s, the Channels server; uvicorn runs "
            "uvloop + httptools and is about twice as fast)",
        )
        parser.add_argument(
            "--grpc-port",
            type=int,
            default=None,
            help="TCP port of the gateway's gRPC listener on --host (0: any free port; default: "
            "A2A_GRPC_PORT, off when unset)",
        )
        parser.add_argument(
            "--no-periodic",
            action="store_true",
            help="do not run periodic jobs in-process (embedded: all; distributed: expiry)",
        )

    def handle(self, *args, host: str, port: int, server: str, no_periodic: bool,
               grpc_port: int | None = None, **options):
        if not 0 <= port <= 65535:
            raise CommandError(f"--port must be between 0 and 65535, not {port}")
        if grpc_port is None:
            grpc_port = settings.A2A_GRPC_PORT
        if grpc_port is not None and not 0 <= grpc_port <= 65535:
            raise CommandError(f"--grpc-port must be between 0 and 65535, not {grpc_port}")
        _check_database()
        if grpc_port:
            try:  # a busy gRPC port is one clear error now, not a failed startup later
                bind_socket(host, grpc_port).close()
            except PortInUse as exc:
                raise CommandError(f"gRPC {exc}: pick another --grpc-port") from None
            except OSError as exc:
                raise CommandError(f"cannot listen on {host}:{grpc_port}: {exc.strerror}") \
                    from None
        node.serve_grpc(host, grpc_port)
        try:
            sock = bind_socket(host, port)
        except PortInUse as exc:
            raise CommandError(f"{exc}: stop the other server or pick another --port") from None
        except OSError as exc:
            raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        port = sock.getsockname()[1]
        if not os.environ.get("NODE_ID"):
            import socket

            node.serve_as(f"{socket.gethostname()}:{port}")
        _bootstrap_admin_client(self.stdout)
        # The servers' threads open their own connections; do not hold this one open.
        from django.db import connection

        connection.close()
        # Distributed: only A2A_NODE_PERIODIC_TASKS (expiry), under a cluster lock.
        periodic = not no_periodic
        if periodic:
            node.on_startup(_start_periodic)
            node.on_shutdown(_stop_periodic)
        mode = "embedded" if settings.EMBEDDED else "distributed"
        grpc = "" if grpc_port is None else f", gRPC on {host}:{grpc_port or '(any free port)'}"
        self.stdout.write(
            f"Node {node.node_id()} ({mode}) serving on http://{host}:{port}/ with {server}"
            f"{grpc}{' and in-process periodic jobs' if periodic else ''}. Ctrl-C stops it."
        )
        self.stdout.flush()
        if host not in _LOOPBACK and not os.environ.get("ALLOWED_HOSTS") and not settings.DEBUG:
            self.stderr.write(
                f"warning: listening on {host}, but ALLOWED_HOSTS is the embedded default "
                f"({', '.join(settings.ALLOWED_HOSTS)}): requests naming another host get 400. "
                "Set ALLOWED_HOSTS to the host names clients use."
            )
        limits = ServerLimits.from_settings()
        if server == "uvicorn":
            run_uvicorn(sock, limits)
        else:
            run_daphne(sock, limits)


def run_uvicorn(sock, limits: ServerLimits) -> None:
    import uvicorn
    from channels.routing import get_default_application

    from node.servers import uvicorn_protocol

    application = get_default_application()  # ASGI_APPLICATION (config/asgi.py)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            node.begin_drain()  # before uvicorn's own shutdown: calls it cancels get an answer
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        application,
        loop="uvloop",
        http=uvicorn_protocol(limits),
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_keep_alive=max(1, round(limits.keepalive)),
        backlog=BACKLOG,  # uvicorn listens on the bound socket after its lifespan startup
        # SIGTERM: stop accepting, close idle connections, let the requests in flight finish
        # for up to the drain; what uvicorn then cancels is answered `node_stopping`.
        timeout_graceful_shutdown=settings.A2A_SHUTDOWN_DRAIN_SECONDS,  # type: ignore[arg-type]  # asyncio takes a float
        # X-Forwarded-* are believed only from A2A_TRUSTED_PROXIES (gateway.cards), not
        # from whatever uvicorn's own default (127.0.0.1) trusts.
        proxy_headers=False,
    )
    Server(config).run(sockets=[sock])


def run_daphne(sock, limits: ServerLimits) -> None:
    import daphne.server
    from channels.routing import get_default_application
    from daphne.server import Server
    from twisted.internet import defer, reactor
    from twisted.internet.endpoints import AdoptedStreamServerEndpoint
    from twisted.internet.error import ReactorNotRunning

    from node.servers import daphne_factory_class

    application = get_default_application()  # ASGI_APPLICATION (config/asgi.py)

    # Server.run() builds its HTTP factory and its endpoints from these module attributes:
    # the limited factory, and the socket bound (and checked) before "serving" was printed.
    daphne.server.HTTPFactory = daphne_factory_class(limits)
    parse_endpoint = daphne.server.serverFromString

    def endpoint(reactor_, description: str):
        if description == _BOUND_SOCKET:
            # The endpoint closes the descriptor it adopts: give it a duplicate.
            return AdoptedStreamServerEndpoint(reactor_, os.dup(sock.fileno()), sock.family)
        return parse_endpoint(reactor_, description)

    daphne.server.serverFromString = endpoint

    async def start_then_listen() -> None:
        try:
            await node.start()
        finally:
            sock.listen(BACKLOG)  # the adopted duplicate shares the socket: it accepts now

    def ready() -> None:
        loop = asyncio.get_event_loop()
        loop.create_task(start_then_listen())
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal)

    # Daphne's own signal handling stops the reactor at once, and its "before shutdown" trigger
    # cancels every request in flight: a rolling restart would cut them all. Drain first, as
    # uvicorn does: stop accepting, close idle connections (busy ones close after their
    # answer), let the requests in flight finish for up to A2A_SHUTDOWN_DRAIN_SECONDS, then
    # stop the reactor (what Daphne cancels then is answered `node_stopping`). A second
    # signal stops at once.
    def stop_reactor() -> None:
        if reactor.running:
            with contextlib.suppress(ReactorNotRunning):  # already stopping
                reactor.stop()  # type: ignore[misc]  # zope interface method

    def on_signal() -> None:
        if node.draining():
            stop_reactor()
            return
        node.begin_drain()
        asyncio.get_event_loop().create_task(drain())

    async def drain() -> None:
        loop = asyncio.get_event_loop()
        deadline = loop.time() + settings.A2A_SHUTDOWN_DRAIN_SECONDS
        try:
            for listening in list(server.listeners):  # Deferreds of the listening ports
                listening.addCallback(lambda port: port.stopListening())
            sock.close()  # the listener adopted a duplicate: the bound socket itself stops too
            server.http_factory.edge_drain()
            logger.warning("stopping: no new connections; draining the requests in flight "
                           "for up to %s s (A2A_SHUTDOWN_DRAIN_SECONDS)",
                           settings.A2A_SHUTDOWN_DRAIN_SECONDS)
            await asyncio.sleep(0.1)
            while loop.time() < deadline and any(
                details.get("application_instance") is not None
                and not details["application_instance"].done()
                for details in list(server.connections.values())
            ):
                await asyncio.sleep(0.1)
        finally:
            stop_reactor()

    server = Server(
        application=application,
        endpoints=[_BOUND_SOCKET],
        ready_callable=ready,
        http_timeout=None,
        websocket_timeout=None,
        application_close_timeout=10,
        verbosity=0,
        signal_handlers=False,  # ready() installs the draining ones
    )

    # Daphne has no lifespan protocol: stop the node's hooks when the reactor stops. Twisted
    # waits for a Deferred returned by a "before shutdown" trigger (not for an asyncio Future),
    # so SIGTERM finishes the node's shutdown before the process exits.
    def stop_node():
        return defer.Deferred.fromFuture(asyncio.ensure_future(node.stop()))

    reactor.addSystemEventTrigger("before", "shutdown", stop_node)  # type: ignore[arg-type]  # zope interface method
    server.run()
    sock.close()
    if not server.listening_addresses:
        raise CommandError("daphne could not listen on the bound socket")


_BOUND_SOCKET = "bound-socket"
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
_periodic_tasks: list[asyncio.Task] = []


async def _start_periodic() -> None:
    from node.periodic import start_periodic_tasks

    _periodic_tasks.extend(start_periodic_tasks())


async def _stop_periodic() -> None:
    for task in _periodic_tasks:
        task.cancel()
    _periodic_tasks.clear()
