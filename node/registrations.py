"""Registrations answered before Django's view stack, as heartbeats are (node.heartbeats).

``POST /api/v1/agents`` (a JSON body with a ``Content-Length``) and KubeMQ's
``POST /agents/register``, with a bearer token or none, are answered here: the token from the
process's token cache (the one DRF uses), then, in a worker thread, the very functions the DRF
views call (:func:`registry.api.views.v1_register`, :func:`registry.kubemq_api.kubemq_register`
are each a check, a write and an answer:
one validation, one URL check, one card parser, the same events, audit and quotas), their
refusals answered by the views' own exception handlers. Registrations arriving together are
checked one by one and written together (group commit, :mod:`core.batching`): one thread
handoff and one transaction of multi-row statements per batch. The DRF views stay the documented
implementation (OpenAPI) and answer what this path passes on: staff sessions, other content
types, bodies without a ``Content-Length`` on /api/v1. Django's view and middleware stack and
its one-at-a-time sync thread cost more than a registration itself (docs/adr/0005).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson
from channels.db import database_sync_to_async
from django.conf import settings

from core import outage
from core.batching import Coalescer, Overloaded, per_loop
from gateway import metrics
from gateway.bodies import BodyTooLarge, Disconnected, Receive, Send, read_body
from gateway.cards import host_allowed
from node.heartbeats import authenticate, check_breaker, outage_answer, send_json
from registry import netcheck
from registry.api.exceptions import exception_handler
from registry.api.parsers import parse_json
from registry.api.views import v1_registered, v1_registration
from registry.cards import card_endpoint
from registry.kubemq_api import (
    kubemq_exception_handler,
    kubemq_registered,
    kubemq_registration,
    kubemq_too_large,
    parse_object,
)
from registry.permissions import Actor
from registry.services import Registration, agents_register

_V1_PATH = re.compile(r"^/api/v1/agents/?\Z")
_KUBEMQ_PATH = re.compile(r"^/agents/register/?\Z")


def route(scope: dict[str, Any]) -> Callable[..., Awaitable[None]] | None:
    """The fast handler for this request, or None to let Django answer it."""
    if scope["method"] != "POST":
        return None
    path = scope["path"]
    if _V1_PATH.match(path):
        kind = "v1"
    elif _KUBEMQ_PATH.match(path):
        kind = "kubemq"
    else:
        return None
    authorization = cookie = content_type = length = host = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorization = value.decode("latin-1")
        elif name == b"cookie":
            cookie = value
        elif name == b"host":
            host = value
        elif name == b"content-type":
            content_type = value
        elif name == b"content-length":
            length = value
    if authorization is None and cookie is not None:
        return None  # a staff session: Django's authentication (and CSRF) handles it
    if host is not None and not host_allowed(host.decode("latin-1")):
        return None  # Django refuses a Host outside ALLOWED_HOSTS (node.views.bad_request)
    if kind == "v1":
        # DRF picks the parser by Content-Type and reads no body without a Content-Length:
        # anything but a JSON body of announced length goes to the view.
        if length is None or content_type is None or \
                content_type.split(b";", 1)[0].strip() != b"application/json":
            return None

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await _answer(kind, authorization, receive, send)

    return app


async def _answer(kind: str, authorization: str | None, receive: Receive, send: Send) -> None:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE if kind == "v1" else settings.A2A_MAX_CARD_BYTES
    too_large = False
    try:
        body = await read_body(receive, limit)
    except Disconnected:
        return
    except BodyTooLarge:
        body, too_large = b"", True
    # DRF authenticates before the view reads the body: a refusal of the caller comes first.
    status, payload, extra, actor = await authenticate(authorization)
    if actor is not None:
        if too_large:
            status, payload = 413, (
                {"error": "request body too large"} if kind == "v1"  # the API's RequestDataTooBig
                else {"error": str(kubemq_too_large())}
            )
        else:
            status, payload = await _registered(_Item(kind, actor, body), extra)
            if status == 429 and isinstance(payload.get("retry_after"), int):
                # A tenant's rate quota (the handlers' Response headers stay behind in the
                # worker thread; their body carries the wait).
                extra.append((b"retry-after", str(payload["retry_after"]).encode()))
    await send_json(send, status, payload, extra)


# Registrations arriving together are written together (group commit): one thread handoff,
# one transaction and a few multi-row statements per batch instead of per registration.
MAX_BATCH = 64
MAX_WAITING = 4096  # past this many waiting registrations a node answers 503 at once
MAX_RUNNING = 2


@dataclass(frozen=True, slots=True)
class _Item:
    kind: str
    actor: Actor
    body: bytes
    # The v1 body parsed on the loop when it is a JSON object (parsed once, not again in the
    # batch); None: parsed in the batch, whose parser answers what is wrong with it.
    data: dict[str, Any] | None = None


async def _registered(item: _Item, extra: list[tuple[bytes, bytes]]
                      ) -> tuple[int, dict[str, Any]]:
    """``item``'s answer, written with the registrations arriving with it; the JSON 503
    (``Retry-After`` appended to ``extra``) while the database is down or the node is
    swamped, as :func:`node.heartbeats.call_registry` answers."""
    try:
        check_breaker()
        data = _object(item.body)
        if item.kind == "v1" and data is not None:
            item = replace(item, data=data)
        if _fetches_its_card(item.kind, data):
            return await _alone(item)
        await _look_up_ahead(item.kind, data)
        return await _batches().submit(item)
    except Overloaded:
        extra.append((b"retry-after", b"1"))
        return 503, {"error": "this node has too many registrations waiting; retry"}
    except Exception as exc:
        return outage_answer(exc, extra)


def _object(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or None (its refusal is the batch's, as DRF's would be)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def _fetches_its_card(kind: str, data: dict[str, Any] | None) -> bool:
    """Whether the registration names a URL and no card, so registering it fetches the card
    from the agent: that takes as long as the agent makes it (up to the fetch's timeout), so
    it is done in a thread of its own, never in a batch where a slow or hostile agent would
    hold every registration written with it."""
    if kind != "v1" or data is None:
        return False  # a KubeMQ registration is its card
    return data.get("url") is not None and data.get("card") is None


async def _look_up_ahead(kind: str, data: dict[str, Any] | None) -> None:
    """Look up the host names the registration's URL check will resolve, here, each bounded
    by ``A2A_URL_CHECK_DNS_TIMEOUT_SECONDS`` (:mod:`registry.netcheck`), before it joins a
    batch: the check in the batch then finds them cached, so a registrant's slow (or
    hostile) name server delays its own registration, never the batch written with it."""
    if data is None:
        return
    card = data.get("card") if kind == "v1" else data
    urls = [data.get("url"), card_endpoint(card) if isinstance(card, dict) else None]
    hosts = {host for url in urls if (host := netcheck.host_to_look_up(url)) is not None
             and netcheck.cached_addresses(host) is None}
    if not hosts:
        return
    waits = {}
    for host in hosts:
        future = netcheck.lookup(host)
        if future is None:
            netcheck.unresolved_for_now(host)  # too many lookups under way already
        else:
            waits[asyncio.wrap_future(future)] = host
    if waits:
        _, late = await asyncio.wait(waits, timeout=settings.A2A_URL_CHECK_DNS_TIMEOUT_SECONDS)
        for waited in late:
            netcheck.unresolved_for_now(waits[waited])


async def _alone(item: _Item) -> tuple[int, dict[str, Any]]:
    """``item`` checked and written on its own, in a worker thread of its own."""
    answer: tuple[int, dict[str, Any]] | Exception
    (answer,) = await database_sync_to_async(_settle, thread_sensitive=False)([item])
    if isinstance(answer, Exception):
        raise answer
    return answer


async def _write(items: list[_Item]) -> list[tuple[int, dict[str, Any]] | Exception]:
    metrics.count_registration_batch(len(items))
    answers: list[tuple[int, dict[str, Any]] | Exception] = await database_sync_to_async(
        _settle, thread_sensitive=False)(items)
    return answers


_batches = per_loop(lambda: Coalescer(_write, max_batch=MAX_BATCH, max_waiting=MAX_WAITING,
                                      max_running=MAX_RUNNING))


def _settle(items: list[_Item]) -> list[tuple[int, dict[str, Any]] | Exception]:
    """Each item's answer (status, body) -- or the database outage it met -- in a worker
    thread: each checked on its own by the views' own functions, the checked ones written
    together (:func:`registry.services.agents_register`), each answered by its view's
    functions and exception handler, as the DRF views answer."""
    answers: list[Any] = [None] * len(items)
    checked: list[int] = []
    regs = []
    for index, item in enumerate(items):
        try:
            regs.append(_check(item))
            checked.append(index)
        except Exception as exc:
            answers[index] = _refusal(item.kind, exc)
    results = agents_register(regs) if regs else []
    for index, result in zip(checked, results, strict=True):
        kind = items[index].kind
        if isinstance(result, Exception):
            answers[index] = _refusal(kind, result)
        elif kind == "v1":
            answers[index] = v1_registered(*result)
        else:
            answers[index] = 200, kubemq_registered(*result)
    return answers


def _check(item: _Item) -> Registration:
    if item.kind == "v1":
        data = item.data
        if data is None:  # DRF: no body, no parser, empty data
            data = parse_json(item.body) if item.body else {}
        return v1_registration(actor=item.actor, data=data, body=item.body)
    return kubemq_registration(actor=item.actor, data=parse_object(item.body), body=item.body)


def _refusal(kind: str, exc: Exception) -> tuple[int, dict[str, Any]] | Exception:
    """The view's own exception handler's answer to ``exc``; an outage (or an error no
    handler answers) is handed back to be raised to its request alone."""
    if outage.is_database_outage(exc):
        return exc
    handler = exception_handler if kind == "v1" else kubemq_exception_handler
    response = handler(exc, {})
    if response is None:
        return exc
    return response.status_code, response.data
