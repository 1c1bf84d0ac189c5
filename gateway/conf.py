"""The gateway's settings: one frozen, typed object, built once when a node starts.

:class:`NodeSettings` holds every setting the gateway reads (the names are those of
``config/settings.py``), as plain slot attributes: ``django.conf.settings`` is a LazyObject
whose Python-level ``__getattribute__`` costs about a microsecond per read, and the request
path reads a dozen settings at tens of thousands of requests per second. A node builds one with
:meth:`NodeSettings.from_django` at start and hands it to its collaborators (routing table,
Subscriber Manager, subscribers, limiter, handler); nothing on the hot path reads
``django.conf.settings``.

The node's id is decided here too: ``NODE_ID`` when configured, else the id ``manage.py
serve`` derived from its port (:func:`core.lifecycle.node_id`).

Tests that change a Django setting while a node runs (pytest-django's ``settings`` fixture,
``override_settings``) send ``setting_changed``: every running node then gets a new object
(:func:`on_change`). Nothing else changes settings at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed

from core import lifecycle as node_config


@dataclass(frozen=True, slots=True)
class NodeSettings:
    """Every setting the gateway reads (see the README's Settings table for each meaning)."""

    NODE_ID: str
    A2A_MAX_REQUEST_BYTES: int
    A2A_MAX_RESPONSE_BYTES: int
    A2A_DEFAULT_TIMEOUT_SECONDS: float
    A2A_MAX_TIMEOUT_SECONDS: float
    A2A_GATEWAY_TIMEOUT_BUFFER_SECONDS: float
    A2A_SSE_KEEPALIVE_SECONDS: float
    A2A_SSE_IDLE_TIMEOUT_SECONDS: float
    A2A_SSE_BUFFER_BYTES: int
    A2A_SSE_STALL_TIMEOUT_SECONDS: float
    A2A_SSE_RESUME_SECONDS: float
    A2A_SSE_RESUME_BUFFER_BYTES: int
    A2A_BROKER_INFLIGHT_BYTES: int
    A2A_LOCAL_FAST_PATH: bool
    A2A_CALLER_ID_HEADER: str
    A2A_DROP_RESPONSE_HEADERS: tuple[str, ...]
    A2A_ERROR_PROFILE: str
    A2A_PUBLIC_BASE_URL: str
    A2A_PUSH_RELAY: bool
    A2A_PUSH_RELAY_BASE_URL: str
    A2A_RATE_LIMIT_PER_SECOND: float
    A2A_RATE_LIMIT_BURST: int
    A2A_TENANT_QUOTAS_REFRESH_SECONDS: float
    A2A_ROUTING_RESYNC_SECONDS: float
    A2A_ROUTING_FULL_RESYNC_SECONDS: float
    A2A_ROUTING_RESYNC_OVERLAP_SECONDS: float
    A2A_NODE_HEARTBEAT_SECONDS: float
    A2A_NODE_LIVENESS_REFRESH_SECONDS: float
    A2A_NODE_LIVENESS_TTL_SECONDS: float
    A2A_FAILOVER: str
    A2A_HANDOVER_TIMEOUT_SECONDS: float
    A2A_EXPIRY_INTERVAL_SECONDS: float
    A2A_GC_FREEZE: bool
    A2A_GC_GEN0_THRESHOLD: int

    @classmethod
    def from_django(cls, **overrides: Any) -> NodeSettings:
        """Read Django's settings once; ``overrides`` (same names) win."""
        values: dict[str, Any] = {}
        for field in fields(cls):
            if field.name == "NODE_ID":
                values["NODE_ID"] = node_config.node_id()
            else:
                values[field.name] = getattr(django_settings, field.name)
        values.update(overrides)
        for name, value in values.items():
            if isinstance(value, list):  # list settings (env_list): frozen, like the object
                values[name] = tuple(value)
        return cls(**values)

    def but(self, **changes: Any) -> NodeSettings:
        """A copy with ``changes`` (the object itself never changes)."""
        return replace(self, **{name: tuple(value) if isinstance(value, list) else value  # type: ignore[arg-type]  # replace() checks
                                for name, value in changes.items()})


NAMES = frozenset(f.name for f in fields(NodeSettings))

#: The settings of code that runs outside a node's collaborators and is handed none (the error
#: bodies' code profile, the caller-id header rule): the most recently started node's, else
#: Django's as of import. Read as ``gateway.conf.active`` (an attribute of this module, so a
#: new node's object is seen at once), never imported by name.
active: NodeSettings = NodeSettings.from_django()

_listeners: list[Callable[[], None]] = []


def activate(node_settings: NodeSettings) -> None:
    """Make ``node_settings`` the process's :data:`active` settings (a node starting)."""
    global active
    active = node_settings


def on_change(listener: Callable[[], None]) -> Callable[[], None]:
    """Call ``listener`` after a gateway setting changed (tests only); returns an
    unsubscribe function."""
    _listeners.append(listener)

    def unsubscribe() -> None:
        if listener in _listeners:
            _listeners.remove(listener)

    return unsubscribe


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    global active
    if setting not in NAMES:
        return
    active = NodeSettings.from_django()
    for listener in list(_listeners):
        listener()


setting_changed.connect(_on_setting_changed, dispatch_uid="gateway.conf")
