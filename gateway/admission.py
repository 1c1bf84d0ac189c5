"""Admission of a gateway call, written once for every binding and every server.

Authentication before the body is read: a caller that does not authenticate is answered 401
without its body being read: the handler checks it before reading a body above
:data:`AUTH_FIRST_ABOVE_BYTES` (or chunked, :func:`read_call_body`), and under Daphne the
server's adapter checks it before Twisted reads such a body at all (``node.servers``). Both ask
:func:`unauthenticated`. Smaller bodies arrive with their headers anyway (one socket read), so
small calls skip the extra step and are authenticated with the rest of their admission.

Then every call (JSON-RPC, HTTP+JSON, the gRPC listener's) takes :func:`admit_call`: the agent
id, authentication (the token cache), authorization, rate limits and the route, each refusal
answered in the caller's binding (:func:`gateway.exchange.send_error`) and audited
(:func:`gateway.recorder.refuse`); then the checks of some methods: the webhook of a push
notification config (:func:`refused_webhook`) and the extended card's caller
(:func:`extended_card`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway import errors, push, recorder
from gateway.bodies import BodyTooLarge, Disconnected, Receive, Send, read_body
from gateway.cards import (
    EXTENDED_CARD_ANONYMOUS,
    EXTENDED_CARD_METHODS,
    CardRewrite,
    gateway_base_url,
    gateway_url,
)
from gateway.envelope import STREAMING_METHODS
from gateway.exchange import REST, discard, send_error
from gateway.headers import AUTHORIZATION_TAG, RequestHeaders
from gateway.tenant_quotas import NO_STREAM, StreamSlot
from registry.auth import UNAUTHENTICATED_MESSAGE
from registry.events import AgentRoute
from registry.ids import AGENT_KEY_RE, split_agent_key
from registry.permissions import ANONYMOUS_ID, Actor
from registry.token_cache import AuthFailed, AuthUnavailable, TokenCache

if TYPE_CHECKING:
    from gateway.binding import BindingCaller
    from gateway.runtime import GatewayNode

#: Bodies above this (or chunked) wait for authentication before they are read.
AUTH_FIRST_ABOVE_BYTES = 64 * 1024


async def unauthenticated(tokens: TokenCache, authorization: str | None) -> str | None:
    """Why a caller presenting ``authorization`` is not authenticated (the 401's detail), or
    None when it is. ``AuthUnavailable`` (the database down and the token never verified)
    propagates: the caller answers it as it answers an outage."""
    try:
        actor = await tokens.actor(authorization)
    except AuthFailed as exc:
        return str(exc)
    return None if actor is not None else UNAUTHENTICATED_MESSAGE


# --- the body ---------------------------------------------------------------------------------


async def read_call_body(node: GatewayNode, scope: dict[str, Any], receive: Receive, send: Send,
                         headers: RequestHeaders, agent_id: str, rpc_id: Any) -> bytes | None:
    """The request body, or None once the call was answered (413 above
    ``A2A_MAX_REQUEST_BYTES``, announced or read; 401 before a large or chunked body is read
    from a caller that does not authenticate) or its caller left. ``rpc_id``: None (JSON-RPC,
    whose id is not read yet) or :data:`~gateway.exchange.REST`."""
    cap = node.settings.A2A_MAX_REQUEST_BYTES
    named = agent_id if rpc_id is REST else None  # JSON-RPC's 413 names no agent
    if headers.content_length is not None and headers.content_length > cap:
        await send_error(send, errors.REQUEST_TOO_LARGE, rpc_id, named,
                         f"request body larger than {cap} bytes",
                         extra=[(b"connection", b"close")])
        return None
    # Authenticate before reading a large (or chunked) body: an unknown caller never gets to
    # upload one. A small body is read first so a refusal can carry the caller's id.
    if (headers.content_length is None or headers.content_length > AUTH_FIRST_ABOVE_BYTES) \
            and not await _authenticated(node, scope,
                                         (await _caller_view(node, agent_id, headers))[0],
                                         send, agent_id, rpc_id):
        return None
    # One receive() holds the whole of a small body: read it here, without a reader coroutine.
    message = await receive()
    body: bytes = message.get("body", b"")
    if message.get("more_body") or message["type"] != "http.request" or len(body) > cap:
        try:
            body = await _read_rest(message, receive, cap)
        except Disconnected:
            return None
        except BodyTooLarge:
            await send_error(send, errors.REQUEST_TOO_LARGE, rpc_id, named,
                             f"request body larger than {cap} bytes",
                             extra=[(b"connection", b"close")])
            return None
    return body


async def _read_rest(first: dict[str, Any], receive: Receive, cap: int) -> bytes:
    """The body from its first message on (gateway.bodies.read_body's rules)."""
    if first["type"] == "http.disconnect":
        raise Disconnected
    pending = [first]

    async def replay() -> dict[str, Any]:
        return pending.pop() if pending else await receive()

    return await read_body(replay, cap)



# --- the caller and the route -----------------------------------------------------------------


async def admit_call(node: GatewayNode, scope: dict[str, Any], send: Send,
                     headers: RequestHeaders, rpc_id: Any, agent_id: str,
                     method: str) -> tuple[str, AgentRoute] | None:
    """Admission of a call: ``(client id, route)``, or None once the refusal was answered.

    The common case completes without waiting: a known agent, a client verified within the
    token cache's lifetime, allowed to call it (:func:`fresh_caller`). Anything else takes
    :func:`admit_to_agent` (same checks, same answers); the rate limit is charged once either
    way."""
    route = node.table.get(agent_id)
    actor = fresh_caller(node, route, headers, agent_id)
    if actor is not None and route is not None:
        if not node.limiter.allow(actor.client_id):
            await rate_limited(scope, send, rpc_id, agent_id, actor.client_id, method)
            return None
        why = node.quotas.refuse_call(route.tenant)
        if why is not None:
            await quota_refused(scope, send, rpc_id, agent_id, actor.client_id, method, why)
            return None
        return actor.client_id, route
    return await admit_to_agent(node, scope, send, headers, rpc_id, agent_id, method)


async def admit_binding_call(node: GatewayNode, scope: dict[str, Any], headers: RequestHeaders,
                             caller: BindingCaller, agent_id: str,
                             method: str) -> tuple[str, AgentRoute] | None:
    """Admission of a call that did not come over HTTP, as a JSON-RPC call's: the agent id,
    authentication (the same token cache), authorization, rate limits and the route. ``(client
    id, route)``, or None once the refusal was handed to ``caller`` (and audited)."""
    return await admit_call(node, scope, discard, headers, caller, agent_id, method)


def fresh_caller(node: GatewayNode, route: AgentRoute | None, headers: RequestHeaders,
                 agent_id: str) -> Actor | None:
    """The common case of admission without a coroutine: a known agent (without credential
    passthrough), a client verified within the token cache's lifetime, allowed to call it --
    its actor; else None, and the caller takes :func:`admit_to_agent` (same checks, same
    answers). The rate limit is the caller's to charge, once either way."""
    if route is None or route.credential_passthrough or AGENT_KEY_RE.match(agent_id) is None:
        return None
    actor = node.tokens.fresh_client(headers.authorization)
    if actor is not None and actor.may_call(agent_id, route):
        return actor
    return None


async def admit_to_agent(node: GatewayNode, scope: dict[str, Any], send: Send,
                         headers: RequestHeaders, rpc_id: Any, agent_id: str,
                         method: str = "") -> tuple[str, AgentRoute] | None:
    """Check the agent id, the caller and the route: ``(caller id, route)``, or None once the
    refusal has been answered (and audited: :func:`gateway.recorder.refuse`)."""
    if not AGENT_KEY_RE.match(agent_id):
        await send_error(send, errors.INVALID_REQUEST, rpc_id, None, "invalid agent id")
        return None
    authorization, route = await _caller_view(node, agent_id, headers)
    if route is not None and route.credential_passthrough and headers.authorization is not None:
        # Credential passthrough: Authorization belongs to the agent and travels unchanged;
        # the caller authenticates to the gateway with X-Gateway-Authorization.
        headers.tags[AUTHORIZATION_TAG] = headers.authorization
    caller = await _admit(node, scope, send, authorization, rpc_id, agent_id, method, route)
    if caller is None:
        return None
    if route is None:
        recorder.refuse(agent_id, caller, method, errors.AGENT_NOT_FOUND,
                        errors.http_status_for(errors.AGENT_NOT_FOUND))
        expired = node.table.expired_at(agent_id)
        await send_error(send, errors.AGENT_NOT_FOUND, rpc_id, agent_id,
                     errors.expired_detail(expired) if expired is not None else "")
        return None
    why = node.quotas.refuse_call(route.tenant)
    if why is not None:
        await quota_refused(scope, send, rpc_id, agent_id, caller, method, why)
        return None
    return caller, route


async def _caller_view(node: GatewayNode, agent_id: str,
                       headers: RequestHeaders) -> tuple[str | None, AgentRoute | None]:
    """The credential the caller authenticates to the gateway with, and the agent's route as
    this caller may know it.

    The credential is ``Authorization``, and ``X-Gateway-Authorization`` for an agent with
    credential passthrough (whose ``Authorization`` is the agent's). An unknown agent, and
    another tenant's agent out of the reach of the caller the headers name, get one answer
    (docs/tenants.md): the caller named by ``X-Gateway-Authorization`` when sent, else by
    ``Authorization``, told that no such agent exists -- so no header a caller sends tells it
    that the agent exists. Agents in reach are answered as they always were."""
    route = node.table.get(agent_id)
    own, gateway = headers.authorization, headers.gateway_authorization
    named = gateway if gateway is not None else own
    if route is None:
        return named, None
    if named is not None:
        try:
            actor = await node.tokens.actor(named)
        except AuthFailed:
            if route.credential_passthrough and gateway is None:
                return own, None  # refused as the same header to an unknown agent is
        else:
            if actor is not None and not actor.reaches(route):
                return named, None
    return (gateway if route.credential_passthrough else own), route


async def _authenticated(node: GatewayNode, scope: dict[str, Any], authorization: str | None,
                         send: Send, agent_id: str, rpc_id: Any = None) -> bool:
    """Whether the caller authenticates (answered 401 if not), checked before the body is
    read; ``_admit`` repeats it from the token cache with the request's id."""
    detail = await unauthenticated(node.tokens, authorization)
    if detail is None:
        return True
    refused(scope, agent_id, None, "", errors.UNAUTHENTICATED)
    # Connection: close, so the server stops reading (and discarding) the unread body.
    await send_error(send, errors.UNAUTHENTICATED, rpc_id, agent_id, detail,
                 extra=[(b"www-authenticate", b'Bearer realm="a2a"'), (b"connection", b"close")])
    return False


def refused(scope: dict[str, Any], agent_id: str, caller: str | None, method: str,
            kind: str) -> None:
    """Audit a refused call; a caller not authenticated is named by its address."""
    if caller is None:
        client = scope.get("client")
        caller = f"address:{client[0] if client else '-'}"
    recorder.refuse(agent_id, caller, method, kind, errors.http_status_for(kind))


async def rate_limited(scope: dict[str, Any], send: Send, rpc_id: Any, agent_id: str,
                       caller: str | None, method: str) -> None:
    """Answer (and audit) a call refused by a rate limit: 429 with ``Retry-After``."""
    refused(scope, agent_id, caller, method, errors.RATE_LIMITED)
    await send_error(send, errors.RATE_LIMITED, rpc_id, agent_id, "rate limit exceeded",
                 extra=[(b"retry-after", b"1")])


async def quota_refused(scope: dict[str, Any], send: Send, rpc_id: Any, agent_id: str,
                        caller: str, method: str, why: str) -> None:
    """Answer (and audit) a call refused by its agent's tenant's quota
    (gateway.tenant_quotas): the per-client rate limit's answer, 429 with ``Retry-After``,
    ``why`` naming the quota; the agent was not called."""
    refused(scope, agent_id, caller, method, errors.RATE_LIMITED)
    await send_error(send, errors.RATE_LIMITED, rpc_id, agent_id, why,
                     extra=[(b"retry-after", b"1")])


async def stream_slot(node: GatewayNode, scope: dict[str, Any], send: Send, rpc_id: Any,
                      agent_id: str, caller: str, route: AgentRoute,
                      method: str) -> StreamSlot | None:
    """The slot of an admitted call among its tenant's open streams (:data:`NO_STREAM` for
    a call that is not a stream), or None once the refusal (``max_concurrent_streams``) was
    answered. The entry gives the slot back when the stream ends, in a ``finally``."""
    if method not in STREAMING_METHODS:
        return NO_STREAM
    slot = node.quotas.open_stream(route.tenant)
    if isinstance(slot, str):
        await quota_refused(scope, send, rpc_id, agent_id, caller, method, slot)
        return None
    return slot


async def _admit(node: GatewayNode, scope: dict[str, Any], send: Send, authorization: str | None,
                 rpc_id: Any, agent_id: str, method: str = "",
                 route: AgentRoute | None = None) -> str | None:
    """Rate-limit by address (calls refused earlier), authenticate, authorize and rate-limit
    by caller: the caller's client id, or None once the refusal has been answered."""
    limiter = node.limiter
    client = scope.get("client")
    address = client[0] if client else "-"
    if limiter.address_blocked(address) and not node.tokens.verified(authorization):
        await rate_limited(scope, send, rpc_id, agent_id, None, method)
        return None
    detail = UNAUTHENTICATED_MESSAGE  # no credentials
    try:
        actor = await node.tokens.actor(authorization)
    except AuthUnavailable as exc:
        await send_error(send, errors.AUTH_UNAVAILABLE, rpc_id, agent_id, str(exc),
                     extra=[(b"retry-after", b"1")])
        return None
    except AuthFailed as exc:
        actor, detail = None, str(exc)
    if actor is None:
        limiter.charge_refused(address)
        refused(scope, agent_id, None, method, errors.UNAUTHENTICATED)
        await send_error(send, errors.UNAUTHENTICATED, rpc_id, agent_id, detail,
                     extra=[(b"www-authenticate", b'Bearer realm="a2a"')])
        return None
    if not (actor.reaches(route) if route is not None
            else actor.in_tenant(split_agent_key(agent_id)[0])):
        # Another tenant's agent out of this caller's reach: answered as an unknown agent
        # (docs/tenants.md), the same body, so a refusal never confirms that it exists.
        refused(scope, agent_id, actor.client_id, method, errors.AGENT_NOT_FOUND)
        await send_error(send, errors.AGENT_NOT_FOUND, rpc_id, agent_id, "")
        return None
    if not actor.may_call(agent_id, route):
        refused(scope, agent_id, actor.client_id, method, errors.FORBIDDEN)
        await send_error(send, errors.FORBIDDEN, rpc_id, agent_id,
                     f"this client may not call {agent_id}")
        return None
    key = actor.client_id if not actor.is_anonymous else f"anonymous:{address}"
    if not limiter.allow(key):
        await rate_limited(scope, send, rpc_id, agent_id, actor.client_id, method)
        return None
    return actor.client_id


# --- the checks of some methods -------------------------------------------------------------


async def refused_webhook(scope: dict[str, Any], agent_id: str, caller: str, method: str,
                          params: Any, *, rest: bool = False,
                          relay_base: str | None = None) -> str | None:
    """Why a push-notification webhook ``params`` of ``method`` carries is refused
    (:mod:`gateway.push`; the refusal audited), or None: the one check of every binding. With
    ``relay_base`` (relay mode: :func:`relay_base`), the accepted configs are then kept and
    rewritten in place to point at the gateway (:func:`gateway.push.relay`)."""
    if method not in push.METHODS:
        return None
    why = await push.check(method, params, rest=rest)
    if why is None and relay_base is not None and push.carries(method, params, rest=rest):
        why = await push.relay(method, params, agent_id=agent_id, caller=caller,
                               base_url=relay_base, rest=rest)
    if why is not None:
        refused(scope, agent_id, caller, method, errors.WEBHOOK_REFUSED)
    return why


def relay_base(node: GatewayNode, route: AgentRoute, scope: dict[str, Any] | None,
               headers: RequestHeaders | None) -> str | None:
    """None when the webhooks of calls to ``route``'s agent go to it unchanged; else the base
    URL the agent reaches this node's push relay at: ``A2A_PUSH_RELAY_BASE_URL``, else
    ``A2A_PUBLIC_BASE_URL``, else the one the caller reached (``""`` for a gRPC caller, who
    names no HTTP host: then the relay refuses, naming the setting)."""
    settings = node.settings
    if not push.relays(route, settings.A2A_PUSH_RELAY):
        return None
    if settings.A2A_PUSH_RELAY_BASE_URL:
        return settings.A2A_PUSH_RELAY_BASE_URL
    if scope is None or headers is None:
        return settings.A2A_PUBLIC_BASE_URL
    return gateway_base_url(scope, headers.host, headers.forwarded_proto,
                            headers.forwarded_host)


async def extended_card(scope: dict[str, Any], send: Send, headers: RequestHeaders, rpc_id: Any,
                        agent_id: str, caller: str, method: str, *,
                        rest_body: bool = False) -> CardRewrite | None:
    """An extended-card call (A2A's ``GetExtendedAgentCard``): answered only to an
    authenticated caller (an anonymous one, with ``A2A_ALLOW_ANONYMOUS``, gets 401, audited;
    None), and its card rewritten like the public card: the ``send`` that does it."""
    if anonymous_card_call(scope, agent_id, caller, method):
        await send_error(send, errors.UNAUTHENTICATED, rpc_id, agent_id, EXTENDED_CARD_ANONYMOUS,
                     extra=[(b"www-authenticate", b'Bearer realm="a2a"')])
        return None
    return CardRewrite(send, gateway_url(scope, headers, agent_id), rest=rest_body)


def anonymous_card_call(scope: dict[str, Any], agent_id: str, caller: str, method: str) -> bool:
    """Whether ``method`` asks for the extended card and ``caller`` is anonymous: then it is
    refused (audited; the caller answers ``unauthenticated``), on every binding."""
    if method in EXTENDED_CARD_METHODS and caller == ANONYMOUS_ID:
        refused(scope, agent_id, caller, method, errors.UNAUTHENTICATED)
        return True
    return False

