"""The outbound policy: one typed snapshot of the settings every outbound client is built from.

Django-light on purpose: this is the only module of the package that reads
``django.conf.settings``, once per change (``setting_changed`` rebuilds it), so the clients never
pay for a LazyObject read per request and the package stays importable by registry, gateway and
discovery alike.

- TLS: the system trust store plus ``A2A_OUTBOUND_CA_FILE`` (a PEM bundle of private CAs), for
  every client: the gateway's hot path, card fetches at registration, discovery.
- Proxies: ``A2A_OUTBOUND_PROXY`` (a URL) for the library clients (card fetches, discovery, the
  aiohttp hot-path client). The standard ``HTTP(S)_PROXY`` variables are deliberately NOT read:
  the hot-path client connects directly, and every client must reach agents the same way.
- Timeouts and pools: connect timeout, keep-alive expiry, idle connections per origin.
- Bounds on what an agent may send before its body: header count and header bytes.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

#: The settings the policy is a projection of (their defaults and validation live once, in
#: ``config/settings.py``); a change to one of them rebuilds the policy.
SETTINGS = frozenset({
    "A2A_OUTBOUND_CA_FILE",
    "A2A_OUTBOUND_PROXY",
    "A2A_OUTBOUND_CLIENT",
    "A2A_OUTBOUND_CONNECT_TIMEOUT_SECONDS",
    "A2A_OUTBOUND_MAX_HEADERS",
    "A2A_OUTBOUND_MAX_HEADER_BYTES",
})

#: Idle keep-alive connections expire after this, just under the common 5 s idle timeout of
#: agent servers (uvicorn, Node), so a pooled connection is not reused as the agent closes it.
KEEPALIVE_SECONDS = 4.0
MAX_IDLE_PER_ORIGIN = 256


@dataclass(frozen=True, slots=True)
class Policy:
    ca_file: str
    proxy: str
    client: str  # "own" (the hand-written hot-path client) or "aiohttp"
    connect_timeout: float
    max_headers: int
    max_header_bytes: int
    keepalive_seconds: float = KEEPALIVE_SECONDS
    max_idle_per_origin: int = MAX_IDLE_PER_ORIGIN

    def tls_context(self) -> ssl.SSLContext:
        """Certificate-verifying client context: system store + ``ca_file`` (cached)."""
        context = _tls_contexts.get(self.ca_file)
        if context is None:
            context = ssl.create_default_context()
            if self.ca_file:
                context.load_verify_locations(cafile=self.ca_file)
            _tls_contexts[self.ca_file] = context
        return context


_tls_contexts: dict[str, ssl.SSLContext] = {}
_current: list[Policy] = []
_listeners: list[Any] = []


def _build() -> Policy:
    from django.conf import settings

    return Policy(
        ca_file=settings.A2A_OUTBOUND_CA_FILE or "",
        proxy=settings.A2A_OUTBOUND_PROXY or "",
        client=settings.A2A_OUTBOUND_CLIENT,
        connect_timeout=float(settings.A2A_OUTBOUND_CONNECT_TIMEOUT_SECONDS),
        max_headers=int(settings.A2A_OUTBOUND_MAX_HEADERS),
        max_header_bytes=int(settings.A2A_OUTBOUND_MAX_HEADER_BYTES),
    )


def current() -> Policy:
    """The policy in force (built on first use, rebuilt when a setting changes)."""
    if not _current:
        _current.append(_build())
        _connect_signal()
    return _current[0]


def on_change(callback: Any) -> None:
    """Call ``callback(policy)`` after the policy was rebuilt (clients drop their pools)."""
    _listeners.append(callback)


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in SETTINGS and _current:
        _current[0] = _build()
        for callback in list(_listeners):
            callback(_current[0])


def _connect_signal() -> None:
    from django.core.signals import setting_changed

    setting_changed.connect(_on_setting_changed, dispatch_uid="outbound.policy")
