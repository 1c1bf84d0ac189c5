"""The settings the gateway's hot path reads, as plain attributes.

``django.conf.settings`` is a LazyObject whose Python-level ``__getattribute__`` costs about a
microsecond per read; the request path reads a dozen settings, at tens of thousands of requests
per second. This snapshot is taken at import and refreshed whenever a setting changes
(Django's ``setting_changed``, sent by ``override_settings`` and pytest-django's ``settings``).
"""

from __future__ import annotations

from django.conf import settings
from django.core.signals import setting_changed

NAMES = (
    "NODE_ID",
    "A2A_MAX_REQUEST_BYTES",
    "A2A_MAX_RESPONSE_BYTES",
    "A2A_DEFAULT_TIMEOUT_SECONDS",
    "A2A_MAX_TIMEOUT_SECONDS",
    "A2A_GATEWAY_TIMEOUT_BUFFER_SECONDS",
    "A2A_LOCAL_FAST_PATH",
    "A2A_CALLER_ID_HEADER",
    "A2A_RATE_LIMIT_PER_SECOND",
    "A2A_RATE_LIMIT_BURST",
    "A2A_ROUTING_RESYNC_SECONDS",
    "A2A_EXPIRY_INTERVAL_SECONDS",
    "A2A_AUTH_CACHE_SECONDS",
    "A2A_ERROR_PROFILE",
)


class _Conf:
    __slots__ = NAMES

    NODE_ID: str
    A2A_MAX_REQUEST_BYTES: int
    A2A_MAX_RESPONSE_BYTES: int
    A2A_DEFAULT_TIMEOUT_SECONDS: float
    A2A_MAX_TIMEOUT_SECONDS: float
    A2A_GATEWAY_TIMEOUT_BUFFER_SECONDS: float
    A2A_LOCAL_FAST_PATH: bool
    A2A_CALLER_ID_HEADER: str
    A2A_RATE_LIMIT_PER_SECOND: float
    A2A_RATE_LIMIT_BURST: int
    A2A_ROUTING_RESYNC_SECONDS: float
    A2A_EXPIRY_INTERVAL_SECONDS: float
    A2A_AUTH_CACHE_SECONDS: float
    A2A_ERROR_PROFILE: str


conf = _Conf()

_DEFAULTS = {"A2A_EXPIRY_INTERVAL_SECONDS": 5.0, "A2A_LOCAL_FAST_PATH": True}


def reload() -> None:
    for name in NAMES:
        setattr(conf, name, getattr(settings, name, _DEFAULTS.get(name)))


def _on_setting_changed(*, setting: str, **kwargs) -> None:
    if setting in NAMES:
        reload()


reload()
setting_changed.connect(_on_setting_changed, dispatch_uid="gateway.conf")
