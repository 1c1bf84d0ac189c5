"""OpenTelemetry tracing: setup per process, and a no-op-when-off span helper (docs/tracing.md).

``A2A_TRACING=on`` turns tracing on (default ``off``; the standard ``OTEL_SDK_DISABLED=true``
turns it off again). The exporter follows the standard variables: ``OTEL_TRACES_EXPORTER``
(``otlp``, the default; ``console``; ``none`` to propagate context without exporting),
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` and the rest of
``OTEL_EXPORTER_OTLP_*`` (OTLP over HTTP/protobuf), ``OTEL_BSP_*`` for batching,
``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` for the resource. With tracing off nothing
of the SDK is imported and :func:`span` returns a shared no-op context manager.

The provider is this module's own (also installed as the global one when none is set), so a
test can swap it for one with an in-memory exporter (:func:`setup` with ``exporter=``).
"""

from __future__ import annotations

import contextlib
import logging
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


def _exporter_from_env() -> Any:
    kind = settings.OTEL_TRACES_EXPORTER
    if kind == "none":
        return None
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if kind not in ("otlp", "otlp_proto_http"):
        logger.warning("OTEL_TRACES_EXPORTER=%s is not supported here; using otlp", kind)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # reads OTEL_EXPORTER_OTLP_* itself


def setup(*, exporter: Any = None, force: bool = False) -> bool:
    """Set tracing up for this process per the settings; returns whether it is on.

    ``exporter``: use this exporter (synchronously: tests read spans at once) instead of the
    one the environment names, and turn tracing on regardless of ``A2A_TRACING``.
    """
    if exporter is None and not force:
        if settings.A2A_TRACING != "on":
            return False
        if settings.OTEL_SDK_DISABLED:
            return False
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    shutdown()
    resource = Resource.create(
        {
            "service.name": settings.OTEL_SERVICE_NAME,
            "service.instance.id": node_config.node_id(),
        }
    )
    provider = TracerProvider(resource=resource)
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        env_exporter = _exporter_from_env()
        if env_exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(env_exporter))
    if exporter is None and not isinstance(trace.get_tracer_provider(), TracerProvider):
        # Libraries that trace through the global API (the a2a-sdk does) join in. Not for a
        # test's exporter: the global provider can be set once per process only.
        trace.set_tracer_provider(provider)
    _state["provider"] = provider
    _state["tracer"] = provider.get_tracer("a2a-registry")
    for enable, _disable in list(_hooks):
        enable(_state["tracer"])
    return True


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
