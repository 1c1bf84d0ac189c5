"""Prometheus counters of push notifications, served with the node's ``/metrics``.

``kubemq_a2a_push_received_total`` (pushes an agent sent that were stored),
``kubemq_a2a_push_refused_total{reason}`` (pushes refused at the ingress: ``size``, ``auth``,
``rate``, ``invalid``, ``task``, ``tenant``), ``kubemq_a2a_push_delivered_total``,
``kubemq_a2a_push_retried_total`` (failed attempts that will be retried) and
``kubemq_a2a_push_dead_total``. The ingress counters are this node's (in-process, read at
scrape time). The delivery counters depend on who delivers: in-process delivery
(``A2A_PUSH_DELIVERY=inprocess``) counts in the node; with Celery delivery the workers (which
serve no ``/metrics``) add each event to the cluster's Redis hash :data:`CLUSTER_KEY` (one
``HINCRBY``) and every node's scrape reads it back (one ``HGETALL``): the cluster's totals, on
every node. A scrape waits at most :data:`REDIS_WAIT_SECONDS` for Redis; when it fails the
delivery counters are left out of that scrape (logged, and Redis is not asked again for
:data:`RETRY_AFTER_SECONDS`), the rest of ``/metrics`` is served. A worker that cannot reach
Redis delivers all the same (the event is logged, not counted).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import connections
from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from core.cluster import cluster_of

if TYPE_CHECKING:
    import redis

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_counts: Counter[str] = Counter()
REFUSALS = ("size", "auth", "rate", "invalid", "task", "tenant")
DELIVERY_EVENTS = ("delivered", "retried", "dead")
#: The cluster's delivery counters (a Redis hash: event -> count), with Celery delivery.
CLUSTER_KEY = "a2a:node:{cluster}:push-metrics"
#: The most a scrape or a worker's event waits for Redis.
REDIS_WAIT_SECONDS = 0.25
#: After a failure, Redis is not asked again for this long (and it is logged once per run).
RETRY_AFTER_SECONDS = 10.0

_client: tuple[str, redis.Redis] | None = None
_failed_at: float | None = None


def clustered() -> bool:
    """Whether the delivery counters are the cluster's, in Redis (Celery delivery)."""
    return bool(settings.A2A_PUSH_DELIVERY == "celery" and settings.REDIS_URL)


def _redis() -> redis.Redis | None:
    """The process's client of the cluster's Redis; None while backing off a failure."""
    global _client, _failed_at
    url = str(settings.REDIS_URL)
    if _client is not None and _client[0] != url:
        _client, _failed_at = None, None  # another Redis: its own record
    if _failed_at is not None and time.monotonic() - _failed_at < RETRY_AFTER_SECONDS:
        return None
    if _client is None:
        import redis

        _client = (url, redis.Redis.from_url(
            url, socket_timeout=REDIS_WAIT_SECONDS, socket_connect_timeout=REDIS_WAIT_SECONDS))
    return _client[1]


def _key() -> str:
    return CLUSTER_KEY.format(cluster=cluster_of(connections["default"].settings_dict))


def _failed(what: str, exc: Exception) -> None:
    global _failed_at
    if _failed_at is None:
        logger.warning("push metrics: %s failed: %s: %s (Redis not asked for %gs; logged once "
                       "until it works again)", what, type(exc).__name__, exc,
                       RETRY_AFTER_SECONDS)
    _failed_at = time.monotonic()


def _worked() -> None:
    global _failed_at
    if _failed_at is not None:
        logger.warning("push metrics: Redis works again")
        _failed_at = None


def count(event: str) -> None:
    """One more ``event``: ``received``, ``delivered``, ``retried``, ``dead`` or
    ``refused:<reason>``."""
    if event in DELIVERY_EVENTS and clustered():
        client = _redis()
        if client is None:
            return
        try:
            client.hincrby(_key(), event, 1)
        except Exception as exc:  # Redis down: the delivery goes on uncounted
            _failed(f"counting {event}", exc)
        else:
            _worked()
        return
    with _lock:
        _counts[event] += 1


def cluster_counts() -> dict[str, int] | None:
    """The cluster's delivery counters from Redis; None when Redis cannot be read now."""
    client = _redis()
    if client is None:
        return None
    try:
        raw = client.hgetall(_key())
    except Exception as exc:
        _failed("reading the delivery counters", exc)
        return None
    _worked()
    counts = {(k.decode() if isinstance(k, bytes) else str(k)): int(v) for k, v in raw.items()}
    return {event: counts.get(event, 0) for event in DELIVERY_EVENTS}


def snapshot() -> dict[str, int]:
    with _lock:
        return dict(_counts)


class PushCollector(Collector):
    def describe(self) -> Iterator[CounterMetricFamily]:
        for name in ("received", "refused", "delivered", "retried", "dead"):
            yield CounterMetricFamily(f"kubemq_a2a_push_{name}", "")

    def collect(self) -> Iterator[CounterMetricFamily]:
        counts = snapshot()
        delivery: dict[str, int] | None = counts
        if clustered():
            delivery = cluster_counts()
        yield CounterMetricFamily("kubemq_a2a_push_received",
                                  "Pushes agents sent that were stored.",
                                  value=counts.get("received", 0))
        refused = CounterMetricFamily("kubemq_a2a_push_refused",
                                      "Pushes refused at the ingress, by reason.",
                                      labels=["reason"])
        for reason in REFUSALS:
            refused.add_metric([reason], counts.get(f"refused:{reason}", 0))
        yield refused
        if delivery is None:
            return  # Redis unreadable: these counters are left out of this scrape
        where = "the cluster" if clustered() else "this process"
        yield CounterMetricFamily("kubemq_a2a_push_delivered",
                                  f"Pushes delivered to the caller's webhook ({where}).",
                                  value=delivery.get("delivered", 0))
        yield CounterMetricFamily("kubemq_a2a_push_retried",
                                  f"Failed delivery attempts to be retried ({where}).",
                                  value=delivery.get("retried", 0))
        yield CounterMetricFamily("kubemq_a2a_push_dead",
                                  f"Pushes dead after their last attempt ({where}).",
                                  value=delivery.get("dead", 0))

_registered: list[PushCollector] = []


def register() -> None:
    """Add the collector to the process's registry, once."""
    if not _registered:
        _registered.append(PushCollector())
        REGISTRY.register(_registered[0])
