"""HTTP face of ARD: the well-known manifest and the registry API under ``/ard/v1/``.

Thin Django views (not the proxy hot path): authenticate the tier, parse with :mod:`ard.query`,
read with :mod:`ard.selectors`, answer JSON. Errors are Appendix B's ``{errorCode, message}``;
nothing answers a traceback.

Search, explore and the agent list (full-text ranking, tens of milliseconds at 10,000 agents;
each first waits for the search documents this node deferred, ard.indexer) are async views
whose work runs on a small pool of their own (:data:`WORKERS` threads, at most
:data:`MAX_PENDING` searches admitted at once, beyond that a 503 ``UNAVAILABLE`` with
``Retry-After``): the node's event loop and its other requests never wait for a search, and a
burst of searches cannot take the threads other work (the console flusher, Django's sync
views) runs on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial, wraps
from typing import Any

import orjson
from django.conf import settings
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from ard import catalog, documents, indexer, query, selectors
from ard.query import ArdError
from core import threads
from registry.permissions import Actor
from registry.staff import user_actor
from registry.token_cache import AuthFailed, shared_token_cache

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
#: Threads running searches and explores, and how many may be admitted (running or queued).
WORKERS = 4
MAX_PENDING = 64
_pending = [0]


def base_url(request: HttpRequest) -> str:
    """Public base URL written into entries: ``A2A_PUBLIC_BASE_URL``, else the request's."""
    return settings.A2A_PUBLIC_BASE_URL or request.build_absolute_uri("/").rstrip("/")


def _json(status: int, body: Any, **headers: str) -> HttpResponse:
    response = HttpResponse(orjson.dumps(body), status=status, content_type="application/json")
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def request_tier(request: HttpRequest) -> Actor | None:
    """The caller: None (anonymous tier), a token's client, or a staff session.

    A bad token is an error rather than the anonymous tier: a client that meant to
    authenticate must learn its token failed. Tokens resolve through the process's one token
    cache, as on every other surface: a revoked token stops working after the same delay."""
    header = request.META.get("HTTP_AUTHORIZATION")
    if header:
        try:
            actor = shared_token_cache().actor_sync(header)
        except AuthFailed as exc:
            raise ArdError(401, "UNAUTHENTICATED", str(exc)) from None
        if actor is None:
            raise ArdError(401, "UNAUTHENTICATED", "invalid or revoked token")
        return actor
    user = getattr(request, "user", None)
    return user_actor(user)


def ard_view(methods: tuple[str, ...]) -> Callable:
    """Method check, Appendix B errors for :class:`ArdError`, a JSON 500 for anything else."""

    def decorate(fn: Callable) -> Callable:
        @csrf_exempt
        @wraps(fn)
        def view(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if request.method not in methods:
                return _json(
                    405,
                    {"errorCode": "METHOD_NOT_ALLOWED", "message": f"use {' or '.join(methods)}"},
                    Allow=", ".join(methods),
                )
            try:
                return fn(request, *args, **kwargs)
            except ArdError as exc:
                extra = {"WWW_Authenticate": 'Bearer realm="ard"'} if exc.status == 401 else {}
                return _json(exc.status, exc.body(), **extra)
            except Exception:
                logger.exception("ARD %s %s failed", request.method, request.path)
                return _json(
                    500,
                    {
                        "errorCode": "INTERNAL_ERROR",
                        "message": "internal error; the server log has details",
                    },
                )

        return view

    return decorate


def _pool_executor() -> ThreadPoolExecutor:
    return threads.pool("ard-search", WORKERS)


def _in_worker(view: Callable, request: HttpRequest, *args, **kwargs) -> HttpResponse:
    """Run a sync view on a pool thread; the thread's database connection is handled like a
    request thread's (closed when too old or broken)."""
    close_old_connections()
    try:
        # This node's deferred search documents first (read your writes): waited for here, on
        # the search pool, never on the thread Django's sync views share.
        indexer.settle_deferred()
        return view(request, *args, **kwargs)
    finally:
        close_old_connections()


def ard_pooled_view(methods: tuple[str, ...]) -> Callable:
    """:func:`ard_view`, run on the search pool from an async view (see the module docstring)."""

    def decorate(fn: Callable) -> Callable:
        sync_view = ard_view(methods)(fn)

        @csrf_exempt
        @wraps(fn)
        async def view(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if _pending[0] >= MAX_PENDING:
                return _json(
                    503,
                    {"errorCode": "UNAVAILABLE",
                     "message": "too many ARD requests in progress on this node; retry shortly"},
                    Retry_After="1",
                )
            _pending[0] += 1
            try:
                return await asyncio.get_running_loop().run_in_executor(
                    _pool_executor(), partial(_in_worker, sync_view, request, *args, **kwargs)
                )
            finally:
                _pending[0] -= 1

        return view

    return decorate


def _body(request: HttpRequest) -> Any:
    declared = request.META.get("CONTENT_LENGTH") or "0"
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise query.invalid(f"request body larger than {MAX_BODY_BYTES} bytes")
    raw = request.read(MAX_BODY_BYTES + 1)
    if len(raw) > MAX_BODY_BYTES:
        raise query.invalid(f"request body larger than {MAX_BODY_BYTES} bytes")
    if not raw.strip():
        raise query.invalid("a JSON request body is required")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise query.invalid(f"request body is not valid JSON: {exc}") from None


def _etag_matches(header: str, etag: str) -> bool:
    return any(c.strip() == "*" or c.strip().removeprefix("W/") == etag for c in header.split(","))


@ard_view(("GET", "HEAD"))
def ai_catalog(request: HttpRequest) -> HttpResponse:
    """``GET /.well-known/ai-catalog.json``."""
    actor = request_tier(request)
    body, etag = catalog.catalog_bytes(actor=actor, base_url=base_url(request))
    headers = {
        "ETag": etag,
        "Vary": "Authorization",
        "Cache_Control": ("private" if actor else "public")
        + f", max-age={settings.ARD_CATALOG_MAX_AGE_SECONDS}",
    }
    if _etag_matches(request.META.get("HTTP_IF_NONE_MATCH", ""), etag):
        response = HttpResponse(status=304)
    else:
        response = HttpResponse(
            b"" if request.method == "HEAD" else body, content_type="application/json"
        )
        response["Content-Length"] = str(len(body))
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


@ard_view(("GET",))
def api_root(request: HttpRequest) -> HttpResponse:
    """``GET /ard/v1/``: where the operations are (a convenience for people with curl)."""
    api = selectors.api_url(base_url(request))
    return _json(
        200,
        {
            "specification": "Agentic Resource Discovery v0.9",
            "operations": {
                "search": f"POST {api}search",
                "list": f"GET {api}agents",
                "explore": f"POST {api}explore",
            },
            "catalog": base_url(request) + "/.well-known/ai-catalog.json",
            "publisher": documents.publisher_host(),
        },
    )


@ard_pooled_view(("POST",))
def search(request: HttpRequest) -> HttpResponse:
    """``POST /ard/v1/search`` (ARD §7.2)."""
    actor = request_tier(request)
    parsed = query.parse_search(_body(request), actor_key=selectors.actor_key(actor))
    return _json(200, selectors.search(actor=actor, request=parsed, base_url=base_url(request)))


@ard_pooled_view(("POST",))
def explore(request: HttpRequest) -> HttpResponse:
    """``POST /ard/v1/explore`` (ARD §7.3)."""
    actor = request_tier(request)
    parsed = query.parse_explore(_body(request))
    return _json(200, selectors.explore(actor=actor, request=parsed, base_url=base_url(request)))


@ard_pooled_view(("GET",))
def agents(request: HttpRequest) -> HttpResponse:
    """``GET /ard/v1/agents`` (ARD §7.4)."""
    actor = request_tier(request)
    params = {k: request.GET.get(k, "") for k in request.GET}
    parsed = query.parse_list(params, actor_key=selectors.actor_key(actor))
    return _json(
        200, selectors.list_agents(actor=actor, request=parsed, base_url=base_url(request))
    )


@ard_view(("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"))
def not_found(request: HttpRequest, rest: str = "") -> HttpResponse:
    raise ArdError(
        404,
        "NOT_FOUND",
        f"no ARD operation at {request.path[:200]}; see {selectors.api_url(base_url(request))}",
    )
