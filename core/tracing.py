"""OpenTelemetry tracing: setup per process, and a no-op-when-off span helper (docs/tracing.md).

``A2A_TRACING=on`` turns tracing on (default ``off``; the standard ``OTEL_SDK_DISABLED=true``
turns it off again). The exporter follows the standard variables: ``OTEL_TRACES_EXPORTER``
(``otlp``, the default; ``console``; ``none`` to propagate context without exporting),
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` and the rest of
``OTEL_EXPORTER_OTLP_*`` (OTLP over HTTP/protobuf), ``OTEL_BSP_*`` for batching,
``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` for the resource. With tracing off nothing
of the SDK is imported and :func:`span` returns a shared no-op context manager.

From the environment the SDK's own configurator builds the provider and the stock Django,
Celery and httpx instrumentations trace the cold paths (:func:`setup`); a test can swap in a
provider of this module's own with an in-memory exporter (:func:`setup` with ``exporter=``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings

from core import lifecycle as node_config

logger = logging.getLogger(__name__)

_NOOP = contextlib.nullcontext()
_state: dict[str, Any] = {"provider": None, "tracer": None}
_hooks: list[tuple[Callable[[Any], None], Callable[[], None]]] = []


def enabled() -> bool:
    return _state["tracer"] is not None


def tracer() -> Any:
    """The tracer of this process (None when tracing is off)."""
    return _state["tracer"]


#: The ``OTEL_TRACES_EXPORTER`` values whose exporters are installed here.
_EXPORTERS = ("otlp", "otlp_proto_http", "console")


def setup(*, exporter: Any = None, force: bool = False) -> bool:
    """Set tracing up for this process per the settings; returns whether it is on.

    From the environment, the OpenTelemetry SDK's own configurator builds the provider (the
    exporter, ``OTEL_BSP_*`` batching, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``,
    every standard variable it reads), installed as the process's global provider, and the
    stock instrumentations trace the cold paths: Django's views (the API, the console, the
    KubeMQ surface), Celery tasks and httpx requests (card fetches, discovery). The hot paths
    (``/a2a``, heartbeats, registrations before Django) keep their own spans (gateway.tracing),
    which layers switch on through :func:`on_tracer`.

    ``exporter``: use this exporter (synchronously: tests read spans at once) on a provider of
    this module's own, and turn tracing on regardless of ``A2A_TRACING``.
    """
    if exporter is None and not force:
        if settings.A2A_TRACING != "on":
            return False
        if settings.OTEL_SDK_DISABLED:
            return False
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    shutdown()
    resource = {
        "service.name": settings.OTEL_SERVICE_NAME,
        "service.instance.id": node_config.node_id(),
    }
    if exporter is not None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        # Not the global provider: that can be set once per process only.
        own = TracerProvider(resource=Resource.create(resource))
        own.add_span_processor(SimpleSpanProcessor(exporter))
        provider: Any = own
        _state["provider"] = provider
    else:
        if not isinstance(trace.get_tracer_provider(), TracerProvider):
            _configure_sdk(resource)
            _instrument_cold_paths()
        _state["provider"] = provider = trace.get_tracer_provider()
    _state["tracer"] = provider.get_tracer("a2a-registry")
    for enable, _disable in list(_hooks):
        enable(_state["tracer"])
    return True


def _configure_sdk(resource: dict[str, str]) -> None:
    """The SDK's configurator (opentelemetry-distro's), which reads the standard variables
    itself. Two of them are settled first, as documented: ``OTEL_TRACES_EXPORTER`` defaults to
    ``otlp``, and OTLP means OTLP over HTTP/protobuf, the exporter the project ships (the SDK's
    default protocol is gRPC). Metrics stay Prometheus's (``/metrics``) and logs the logging
    module's unless ``OTEL_METRICS_EXPORTER`` / ``OTEL_LOGS_EXPORTER`` ask for more."""
    from opentelemetry.distro import OpenTelemetryConfigurator

    kind = settings.OTEL_TRACES_EXPORTER
    if kind not in _EXPORTERS and kind != "none":
        logger.warning("OTEL_TRACES_EXPORTER=%s is not installed here; using otlp", kind)
        kind = "otlp"
    os.environ["OTEL_TRACES_EXPORTER"] = kind
    for name in ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        if os.environ.get(name, "http/protobuf") != "http/protobuf":
            logger.warning("%s=%s: only OTLP over http/protobuf is installed; using it",
                           name, os.environ[name])
        os.environ[name] = "http/protobuf"
    OpenTelemetryConfigurator().configure(resource_attributes=resource)


def _instrument_cold_paths() -> None:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    for instrumentor in (DjangoInstrumentor(), CeleryInstrumentor(), HTTPXClientInstrumentor()):
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument()


def on_tracer(enable: Callable[[Any], None], disable: Callable[[], None]) -> None:
    """Register a layer's tracing switch: ``enable(tracer)`` when tracing turns on (at once if
    it is on already), ``disable()`` when it turns off. The gateway registers its hot-path
    glue here, so this ground module imports no app."""
    _hooks.append((enable, disable))
    if _state["tracer"] is not None:
        enable(_state["tracer"])


def shutdown() -> None:
    """Turn tracing off in this process, flushing what is buffered."""
    provider = _state["provider"]
    _state["provider"] = _state["tracer"] = None
    for _enable, disable in list(_hooks):
        disable()
    if provider is not None:
        provider.shutdown()


def flush(timeout_millis: int = 5000) -> None:
    provider = _state["provider"]
    if provider is not None:
        provider.force_flush(timeout_millis)


@contextlib.contextmanager
def _span(name: str, attributes: dict[str, Any]) -> Iterator[Any]:
    with _state["tracer"].start_as_current_span(name, attributes=attributes) as current:
        yield current


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A span around a block when tracing is on; a shared no-op context manager when off.

    Attribute values that are None are left out. Exceptions are recorded and re-raised.
    """
    if _state["tracer"] is None:
        return _NOOP
    return _span(name, {k: v for k, v in attributes.items() if v is not None})


def current_context() -> Any:
    """The active context, to hand to work running on another thread or loop (None if off)."""
    if _state["tracer"] is None:
        return None
    from opentelemetry import context

    return context.get_current()


@contextlib.contextmanager
def _child(name: str, parent: Any, attributes: dict[str, Any]) -> Iterator[Any]:
    with _state["tracer"].start_as_current_span(
        name, context=parent, attributes=attributes
    ) as current:
        yield current


def child_span(
    name: str, parent: Any, url: str | None = None, **attributes: Any
) -> contextlib.AbstractContextManager[Any]:
    """Like :func:`span`, under an explicit parent context from :func:`current_context`
    (``url`` becomes ``url.full``)."""
    if _state["tracer"] is None:
        return _NOOP
    if url is not None:
        attributes["url.full"] = url
    return _child(name, parent, {k: v for k, v in attributes.items() if v is not None})


def traced(name: str) -> Any:
    """Decorator: a span named ``name`` around each call when tracing is on (a keyword
    argument ``agent_id`` becomes ``a2a.agent_id``). Off, it costs one check per call."""
    import functools

    def decorate(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _state["tracer"] is None:
                return fn(*args, **kwargs)
            agent_id = kwargs.get("agent_id")
            attributes = {"a2a.agent_id": agent_id} if isinstance(agent_id, str) else {}
            with _span(name, attributes):
                return fn(*args, **kwargs)

        return wrapper

    return decorate


def annotate(target: Any = None, **attributes: Any) -> None:
    """Set attributes on ``target`` (a span) or the current span; nothing when off."""
    if _state["tracer"] is None:
        return
    if target is None:
        from opentelemetry import trace

        target = trace.get_current_span()
    for key, value in attributes.items():
        if value is not None:
            target.set_attribute(key, value)
