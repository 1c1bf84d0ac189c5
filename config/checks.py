"""What ``config/settings.py`` derives from the values it has read, and the checks that refuse
a configuration at start: pure functions of values, never reading the environment themselves
(every variable is read in the settings module, through ``core.env``, so that the list of
settings and the unknown-name check see it).

Each check raises ``ImproperlyConfigured`` with a message that names the variables at fault and
what to do, so a wrong configuration stops the process before it serves anything.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

#: Host names an embedded node answers to without ALLOWED_HOSTS.
LOOPBACK_HOSTS = ["localhost", "127.0.0.1", "[::1]"]


def check_mode(*, database_url: str | None, redis_url: str | None, single_node: bool,
               debug: bool) -> None:
    """The deployment mode is one of embedded, single node (PostgreSQL without Redis, chosen
    explicitly) or distributed; DEBUG only outside distributed mode."""
    # Without the switch, DATABASE_URL alone is refused: a second node started the same way
    # would share the database but not the broker, and calls entering it for the first node's
    # agents would find no subscriber.
    if database_url and not redis_url and not single_node:
        raise ImproperlyConfigured(
            "DATABASE_URL is set but REDIS_URL is not. Set REDIS_URL too for distributed mode "
            "(several nodes, Celery workers and beat), or set A2A_SINGLE_NODE=true to run "
            "exactly one node on this database with the in-memory channel layer and in-process "
            "jobs."
        )
    if single_node and redis_url:
        raise ImproperlyConfigured(
            "A2A_SINGLE_NODE=true and REDIS_URL contradict each other: unset A2A_SINGLE_NODE for "
            "distributed mode, or unset REDIS_URL for one node."
        )
    if debug and redis_url:
        raise ImproperlyConfigured(
            "DEBUG=true is refused in distributed mode (REDIS_URL set): it would accept any "
            "Host header and show tracebacks to callers. Unset DEBUG, or develop in embedded "
            "mode (unset REDIS_URL and DATABASE_URL)."
        )


def secret_key(configured: str | None, *, embedded: bool, data_dir: Path) -> str:
    """The configured key; embedded without one, a key generated once and kept in the data
    folder so sessions survive restarts."""
    if configured:
        return configured
    if not embedded:
        raise ImproperlyConfigured("SECRET_KEY must be set in distributed mode (REDIS_URL set).")
    data_dir.mkdir(parents=True, exist_ok=True)
    key_file = data_dir / ".secret_key"
    if not key_file.exists():
        key_file.write_text(secrets.token_urlsafe(50))
        key_file.chmod(0o600)
    return key_file.read_text().strip()


def allowed_hosts(configured: list[str], *, debug: bool, embedded: bool) -> list[str]:
    """Host names this node answers to. Never "*" by default outside DEBUG: Django's views and
    the gateway's rewritten cards trust the Host header only when it is listed here."""
    if configured:
        return configured
    if debug:
        return ["*"]
    if embedded:
        # Embedded mode serves 127.0.0.1 by default (scripts/run.sh); "testserver" is Django's
        # test client (distributed test runs name it in tests/environment.py).
        return [*LOOPBACK_HOSTS, "testserver"]
    raise ImproperlyConfigured(
        "ALLOWED_HOSTS must be set in distributed mode (REDIS_URL set): the host names "
        "clients use to reach this node, comma-separated, e.g. "
        "ALLOWED_HOSTS=registry.example.com,127.0.0.1 ('*' accepts any Host header)."
    )


def url_databases(database_url: str, *, connect_timeout: int) -> dict[str, dict[str, Any]]:
    """``DATABASES`` for ``DATABASE_URL``; on PostgreSQL with a short connect timeout."""
    default: dict[str, Any] = dict(dj_database_url.parse(database_url, conn_max_age=0))
    default["TEST"] = {"NAME": f"test_{default['NAME']}_{os.getpid()}"}
    if is_postgresql(default):
        default.setdefault("OPTIONS", {}).setdefault("connect_timeout", connect_timeout)
    return _no_persistent_connections({"default": default})


def is_postgresql(database: dict[str, Any]) -> bool:
    return bool(database["ENGINE"] == "django.db.backends.postgresql")


def add_pool(database: dict[str, Any], *, max_size: int, timeout: float,
             connect_timeout: int) -> None:
    """A psycopg pool per process: under ASGI each request may use another thread, and opening
    a PostgreSQL connection per request costs more than the request itself."""
    database.setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": max_size,
        "timeout": timeout,
        # psycopg_pool backs off exponentially while it cannot connect (1, 2, 4, 8, 16 s...),
        # which kept a node failing 18 s after its database came back. Give up on an attempt
        # after a few seconds instead: the next request that needs a connection starts a fresh
        # one at once.
        "reconnect_timeout": connect_timeout + 0.5,
    }


def sqlite_databases(path: str, *, data_dir: Path) -> dict[str, dict[str, Any]]:
    """``DATABASES`` of embedded mode: one SQLite file."""
    data_dir.mkdir(parents=True, exist_ok=True)
    return _no_persistent_connections({
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": path,
            # WAL + a busy timeout let the server, Celery tasks and tests share the file.
            "OPTIONS": {
                "timeout": 20,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            # A file, not :memory:, so the live server's threads and subprocesses share it; one
            # per test process so parallel runs never share a database.
            "TEST": {"NAME": str(data_dir / f"test-registry-{os.getpid()}.sqlite3")},
        }
    })


def _no_persistent_connections(
    databases: dict[str, dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    # Under ASGI every request may run in another thread: persistent connections leak there.
    for database in databases.values():
        database["CONN_MAX_AGE"] = 0
    return databases


def redis_channel_layers(redis_url: str, layer: str) -> dict[str, Any]:
    """``CHANNEL_LAYERS`` on Redis. ``direct``: the gateway's own pipelined Redis pub/sub layer
    (gateway.redis_layer, checked sends); ``pubsub`` / ``core``: channels-redis's layers
    (Sentinel, sharding)."""
    return {
        "default": {
            "BACKEND": {
                "direct": "gateway.redis_layer.RedisDirectChannelLayer",
                "pubsub": "channels_redis.pubsub.RedisPubSubChannelLayer",
                "core": "channels_redis.core.RedisChannelLayer",
            }[layer],
            "CONFIG": {
                "hosts": [
                    {
                        "address": redis_url,
                        "socket_connect_timeout": 2,
                        # Above the core layer's 5 s blocking read: with redis-py 8 an idle
                        # receive() raises TimeoutError otherwise.
                        "socket_timeout": 10,
                    }
                ],
                **({"capacity": 10000, "expiry": 60} if layer == "core" else {}),
            },
        }
    }


def jwt_issuers(text: str) -> list[Any]:
    """``A2A_JWT_ISSUERS`` (docs/identity.md), a JSON list, each entry checked here so a wrong
    one stops the process at start, named."""
    try:
        issuers: list[Any] = json.loads(text or "[]")
    except ValueError as exc:
        raise ImproperlyConfigured(f"A2A_JWT_ISSUERS is not JSON: {exc}") from None
    if issuers:
        from registry.identity import parse_issuers

        parse_issuers(issuers)
    return issuers


def grpc_port(text: str, value: int) -> int | None:
    """``A2A_GRPC_PORT``: off (None) when ``text`` is empty, else a TCP port."""
    if not text:
        return None
    if value > 65535:
        raise ImproperlyConfigured(f"A2A_GRPC_PORT must be a TCP port (0-65535), not {text!r}")
    return value


def ard_public_host(host: str) -> str:
    """``ARD_PUBLIC_HOST``: blank or a domain name."""
    if host and not re.fullmatch(r"[a-z0-9-]+(\.[a-z0-9-]+)+", host):
        raise ImproperlyConfigured(f"ARD_PUBLIC_HOST must be a domain name, not {host!r}")
    return host


def _number(value: float) -> str:
    """A setting's number as written: 30 and 2.5 (a float's ``:g``), an int whole."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def check_agreement(values: dict[str, Any]) -> None:
    """Settings that must agree with one another; ``values`` is the settings module's
    namespace once every name has been read."""
    for name in ("DISCOVERY_NEED_TEXT_MIN_SCORE", "A2A_MCP_QUERY_MIN_SCORE"):
        if values[name] > 100:
            raise ImproperlyConfigured(f"{name} is a score from 1 to 100")
    ttl = values["A2A_NODE_LIVENESS_TTL_SECONDS"]
    refresh = values["A2A_NODE_LIVENESS_REFRESH_SECONDS"]
    if ttl <= refresh:
        raise ImproperlyConfigured(
            f"A2A_NODE_LIVENESS_TTL_SECONDS ({ttl:g}) must be above "
            f"A2A_NODE_LIVENESS_REFRESH_SECONDS ({refresh:g}): a node's "
            "liveness key would expire between two refreshes and its peers would take it for "
            "dead. Raise the TTL to about three refreshes."
        )
    for low, high in (("A2A_DEFAULT_TIMEOUT_SECONDS", "A2A_MAX_TIMEOUT_SECONDS"),
                      ("A2A_DEFAULT_TTL_SECONDS", "A2A_MAX_TTL_SECONDS")):
        default, maximum = values[low], values[high]
        if default > maximum:
            raise ImproperlyConfigured(
                f"{low} ({_number(default)}) is above {high} ({_number(maximum)}): lower the "
                "default or raise the maximum."
            )
