"""Builders of every library HTTP client the platform uses towards agents and registries.

All of them: TLS from the policy (system store + ``A2A_OUTBOUND_CA_FILE``), the policy's proxy
(``A2A_OUTBOUND_PROXY``; the environment's proxy variables are not read), redirects off,
explicit timeouts and pool limits, and the connect-time address check of
:mod:`outbound.resolve` on every new connection.

``httpx`` stays the API of card fetching and discovery. For discovery's many concurrent card
fetches, :class:`AiohttpTransport` carries httpx requests over one pooled aiohttp session.

Why a hand-written transport and not the ``httpx-aiohttp`` package: the newest release on PyPI
is still 0.2.0 (checked 2026-11-30), whose exception map turns every
``aiohttp.ClientConnectionError`` - a connection reset or a server closing mid-response
included - into ``httpx.ConnectTimeout``: a card server that cuts a response would be reported
as "connect timed out", and for the gateway a delivered request as never sent. It also builds
its own session, so the checked resolver and the policy's TLS context would have to be
injected through its internals. Measured here (bench/discovery_bench.py's card server, 3,000
GETs on loopback): plain httpx 1,260/s at concurrency 2 falling to 720/s at 16 (its pool scans
every connection per request, docs/adr/0002), httpx over this transport 11,000/s; the
10,000-card all-304 discovery cycle needs the latter to stay within 10 s on two cores. So the
transport stays, 60 lines, with a correct error map (:func:`_map_aiohttp_error`).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from typing import Any

import httpx

from outbound import policy as _policy
from outbound.errors import OutboundError
from outbound.resolve import CheckedAsyncBackend, CheckedBackend, checked_connector


def _check_backend(transport: Any, backend_class: type) -> Any:
    # httpx offers no public hook for the network backend; httpcore's pool (ConnectionPool and
    # HTTPProxy alike) keeps it in ``_network_backend``. Fail loudly if an upgrade moves it.
    pool = transport._pool
    if not hasattr(pool, "_network_backend"):
        raise RuntimeError("httpcore changed: cannot install the checked network backend")
    pool._network_backend = backend_class(pool._network_backend)
    return transport


def httpx_client(
    *,
    timeout: httpx.Timeout,
    limits: httpx.Limits | None = None,
    headers: dict[str, str] | None = None,
    extra_ca_file: str | None = None,
) -> httpx.Client:
    """A synchronous httpx client under the outbound policy; ``extra_ca_file`` trusts one more
    CA bundle (e.g. a Kubernetes API server's)."""
    current = _policy.current()
    limits = limits or httpx.Limits(max_connections=20)
    context = current.tls_context()
    if extra_ca_file:
        context = ssl.create_default_context()
        if current.ca_file:
            context.load_verify_locations(cafile=current.ca_file)
        context.load_verify_locations(cafile=extra_ca_file)
    transport = httpx.HTTPTransport(
        verify=context, limits=limits, proxy=current.proxy or None, trust_env=False
    )
    return httpx.Client(
        transport=_check_backend(transport, CheckedBackend),
        timeout=timeout,
        follow_redirects=False,
        trust_env=False,
        headers=headers,
    )


def httpx_async_client(
    *,
    timeout: httpx.Timeout,
    limits: httpx.Limits,
    headers: dict[str, str] | None = None,
    transport: str = "aiohttp",
) -> httpx.AsyncClient:
    """An async httpx client under the outbound policy; ``transport`` "aiohttp" (pooled
    aiohttp session, fast at high concurrency) or "httpx" (httpx's own pool)."""
    current = _policy.current()
    if transport == "aiohttp":
        carrier: httpx.AsyncBaseTransport = AiohttpTransport(limits=limits)
    else:
        carrier = _check_backend(
            httpx.AsyncHTTPTransport(
                verify=current.tls_context(),
                limits=limits,
                proxy=current.proxy or None,
                trust_env=False,
            ),
            CheckedAsyncBackend,
        )
    return httpx.AsyncClient(
        transport=carrier, timeout=timeout, follow_redirects=False, trust_env=False, headers=headers
    )


def aiohttp_session(
    *, limit: int = 0, keepalive: float | None = None, **session_options: Any
) -> Any:
    """A pooled aiohttp session under the outbound policy (create it on its event loop)."""
    import aiohttp

    current = _policy.current()
    connector = checked_connector(
        limit=limit,
        limit_per_host=0,
        ssl=current.tls_context(),
        keepalive_timeout=current.keepalive_seconds if keepalive is None else keepalive,
    )
    return aiohttp.ClientSession(
        connector=connector,
        trust_env=False,
        proxy=current.proxy or None,
        auto_decompress=False,
        max_headers=current.max_headers,
        max_field_size=current.max_header_bytes,
        max_line_size=current.max_header_bytes,
        **session_options,
    )


# --- httpx over aiohttp ----------------------------------------------------------------------


def _map_aiohttp_error(exc: BaseException, request: httpx.Request | None = None) -> Exception:
    """The httpx exception for an aiohttp (or connect-check) failure."""
    import aiohttp

    if isinstance(exc, OutboundError):  # the connect-time address check (never sent)
        return httpx.ConnectError(str(exc), request=request)
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(str(exc) or "connect timed out", request=request)
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return httpx.ReadTimeout(str(exc) or "timed out", request=request)
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.InvalidURL):
        return httpx.ConnectError(str(exc) or type(exc).__name__, request=request)
    return httpx.ReadError(str(exc) or type(exc).__name__, request=request)


class _AiohttpStream(httpx.AsyncByteStream):
    def __init__(self, response: Any) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        import aiohttp

        try:
            async for chunk in self._response.content.iter_chunked(65536):
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _map_aiohttp_error(exc) from exc

    async def aclose(self) -> None:
        self._response.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """httpx requests carried by one pooled ``aiohttp.ClientSession`` (created on its loop)."""

    def __init__(self, *, limits: httpx.Limits) -> None:
        self._limit = limits.max_connections or 100
        self._keepalive = limits.keepalive_expiry or 30
        self._session: Any = None

    def _client_session(self) -> Any:
        if self._session is None or self._session.closed:
            self._session = aiohttp_session(
                limit=self._limit,
                keepalive=self._keepalive,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        import aiohttp

        t = request.extensions.get("timeout") or {}
        timeout = aiohttp.ClientTimeout(
            total=None, connect=t.get("connect"), sock_read=t.get("read")
        )
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in request.headers.raw
            if k.lower() != b"host"
        ]
        try:
            response = await self._client_session().request(
                request.method,
                str(request.url),
                headers=headers,
                data=request.content or None,
                allow_redirects=False,
                timeout=timeout,
            )
        except (TimeoutError, aiohttp.ClientError, OutboundError) as exc:
            raise _map_aiohttp_error(exc, request) from exc
        return httpx.Response(
            status_code=response.status,
            headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.raw_headers],
            stream=_AiohttpStream(response),
            request=request,
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
