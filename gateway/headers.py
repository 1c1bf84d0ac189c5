"""Header rules: which caller headers travel to the agent, and which agent headers come back.

Each forwarded caller header rides in the Query envelope as the tag ``a2a_hdr_<name>`` and the
virtual subscriber replays it on the outbound request. Hop-by-hop and sensitive headers never
travel; the caller-identity header is always set by the subscriber from the authenticated
caller, never taken from the caller. Many agent servers (uvicorn, WSGI/CGI servers, nginx with
``underscores_in_headers``) read ``_`` in a header name as ``-``, so a caller header whose name
equals a protected one after folding ``_`` to ``-`` (``X_KubeMQ_Caller_ID``,
``Proxy_Authorization``) is dropped too.

Agent response headers that would act on the gateway's origin, which is also the admin's
(:data:`DROPPED_RESPONSE_HEADERS`, :data:`DROPPED_RESPONSE_PREFIXES`, extended by the setting
``A2A_DROP_RESPONSE_HEADERS``), are never relayed. ``WWW-Authenticate`` is relayed from an agent
that uses credential passthrough (it authenticates its callers itself).

Credential passthrough (an agent setting): the caller's ``Authorization`` reaches the agent
unchanged, and the caller authenticates to the gateway with :data:`GATEWAY_AUTH_HEADER`
instead. That header never reaches any agent.

Every decision is a set or dict lookup: per-name results are cached, so the hot path pays no
string work for the header names it has seen before.
"""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings

from gateway import conf

HDR_TAG_PREFIX = "a2a_hdr_"
#: The header a caller of a credential-passthrough agent authenticates to the gateway with
#: (``X-Gateway-Authorization: Bearer <token>``); ``Authorization`` goes to the agent.
GATEWAY_AUTH_HEADER = "X-Gateway-Authorization"
_GATEWAY_AUTH = GATEWAY_AUTH_HEADER.lower().encode("latin-1")
#: The tag carrying the caller's Authorization to a credential-passthrough agent.
AUTHORIZATION_TAG = HDR_TAG_PREFIX + "authorization"

#: Never forwarded to the agent (lowercase, as ASGI delivers names).
DROPPED_REQUEST_HEADERS = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"host",
        b"content-length",
        b"authorization",
        b"cookie",
        b"set-cookie",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"x-forwarded-for",
        b"x-real-ip",
    }
)
_PROTECTED_REQUEST_HEADERS = DROPPED_REQUEST_HEADERS | {_GATEWAY_AUTH}

#: Never relayed from the agent back to the caller: hop-by-hop, framing (the gateway sets its
#: own), the gateway's own server/date, the gateway's X-A2A-* reply headers (an agent must not
#: be able to forge X-A2A-Executed), headers that would act on the gateway's origin (which
#: is also the admin's): cookies (Set-Cookie, Set-Cookie2), HSTS, Clear-Site-Data, Refresh,
#: Content-Security-Policy (and its -Report-Only twin), WWW-Authenticate (relayed only from
#: agents with credential passthrough) and CORS (:data:`DROPPED_RESPONSE_PREFIXES`); and
#: Location and Content-Location, which point at the agent's own, often internal, address (the
#: gateway never follows redirects; a caller has no use for the agent's URL, only the
#: gateway's, and an agent's 3xx reaches it without a target).
DROPPED_RESPONSE_HEADERS = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"content-length",
        b"proxy-authenticate",
        b"set-cookie",
        b"set-cookie2",
        b"server",
        b"date",
        b"x-a2a-executed",
        b"x-a2a-agent-status",
        b"strict-transport-security",
        b"clear-site-data",
        b"refresh",
        b"content-security-policy",
        b"content-security-policy-report-only",
        b"www-authenticate",
        b"location",
        b"content-location",
    }
)
#: Response header name prefixes never relayed (CORS: Access-Control-Allow-Origin, ...).
DROPPED_RESPONSE_PREFIXES = (b"access-control-",)
_PASSTHROUGH_RELAYED = frozenset({b"www-authenticate"})

_CACHE_LIMIT = 4096
_TAG_KEYS: dict[bytes, str] = {}


def _tag_key(name: bytes) -> str:
    key = _TAG_KEYS.get(name)
    if key is None:
        key = HDR_TAG_PREFIX + name.decode("latin-1").lower()
        if len(_TAG_KEYS) < _CACHE_LIMIT:
            _TAG_KEYS[name] = key
    return key


@lru_cache(maxsize=8)
def _caller_header(name: str) -> tuple[bytes, str]:
    return name.lower().encode("latin-1"), HDR_TAG_PREFIX + name.lower()


def caller_id_header() -> str:
    """The header name carrying the caller's identity to agents (configurable)."""
    return settings.A2A_CALLER_ID_HEADER


def _is_protected_alias(name: bytes, caller_name: bytes) -> bool:
    """Whether ``name`` (containing ``_``) is a protected header once ``_`` reads as ``-``."""
    folded = name.replace(b"_", b"-").lower()
    return folded in _PROTECTED_REQUEST_HEADERS or folded == caller_name


class RequestHeaders:
    """What the gateway reads from a caller's headers, found in one pass."""

    __slots__ = (
        "content_type",
        "content_length",
        "authorization",
        "gateway_authorization",
        "host",
        "tags",
        "forwarded_proto",
        "forwarded_host",
    )

    def __init__(self) -> None:
        self.content_type: bytes = b""
        self.content_length: int | None = None
        self.authorization: str | None = None
        self.gateway_authorization: str | None = None  # GATEWAY_AUTH_HEADER
        self.host: str = ""
        self.forwarded_proto: str = ""
        self.forwarded_host: str = ""
        self.tags: dict[str, str] = {}


# What scan_request_headers does with a request header, by name (decided once per name):
_FORWARD, _DROP, _LENGTH, _AUTHORIZATION, _HOST, _CONNECTION, _GATEWAY, _CONTENT_TYPE, \
    _FORWARDED_PROTO, _FORWARDED_HOST = range(10)
_DROPPED_KINDS = {b"content-length": _LENGTH, b"authorization": _AUTHORIZATION, b"host": _HOST,
                  b"connection": _CONNECTION}
_READ_AND_FORWARDED = {b"content-type": _CONTENT_TYPE, b"x-forwarded-proto": _FORWARDED_PROTO,
                       b"x-forwarded-host": _FORWARDED_HOST}


class _RequestRules:
    """The per-name decisions of :func:`scan_request_headers` for one caller-identity header
    name: name -> (what to do, the ``a2a_hdr_*`` tag of a forwarded header or None)."""

    __slots__ = ("source", "caller_name", "decisions")

    def __init__(self, caller_header: str) -> None:
        self.source = caller_header
        self.caller_name = _caller_header(caller_header)[0]
        self.decisions: dict[bytes, tuple[int, str | None]] = {}

    def decide(self, name: bytes) -> tuple[int, str | None]:
        caller_name = self.caller_name
        if name in DROPPED_REQUEST_HEADERS:
            decision: tuple[int, str | None] = (_DROPPED_KINDS.get(name, _DROP), None)
        elif name == caller_name:
            decision = (_DROP, None)
        elif name == _GATEWAY_AUTH:
            decision = (_GATEWAY, None)
        elif b"_" in name and _is_protected_alias(name, caller_name):
            decision = (_DROP, None)
        else:
            decision = (_READ_AND_FORWARDED.get(name, _FORWARD), _tag_key(name))
        if len(self.decisions) < _CACHE_LIMIT:
            self.decisions[name] = decision
        return decision


_request_rules = _RequestRules(conf.active.A2A_CALLER_ID_HEADER)


def scan_request_headers(raw: list[tuple[bytes, bytes]]) -> RequestHeaders:
    """Read the framing/auth headers and build the ``a2a_hdr_*`` tags of the forwarded ones.

    Invalid Content-Length makes ``content_length`` -1 (the caller answers 400-ish -32700).
    Repeated headers are joined with ", " as HTTP allows. What to do with a header is decided
    once per name (:class:`_RequestRules`): the hot path pays one dict lookup per header.
    """
    global _request_rules
    rules = _request_rules
    caller_header = conf.active.A2A_CALLER_ID_HEADER
    if rules.source != caller_header:  # a node started with other settings, or a test
        rules = _request_rules = _RequestRules(caller_header)
    decisions = rules.decisions
    out = RequestHeaders()
    tags = out.tags
    connection_tokens: list[str] | None = None
    for name, value in raw:
        decision = decisions.get(name)
        if decision is None:
            decision = rules.decide(name)
        kind, key = decision
        if key is None:
            if kind == _LENGTH:
                try:
                    out.content_length = int(value)
                except ValueError:
                    out.content_length = -1
            elif kind == _AUTHORIZATION:
                out.authorization = value.decode("latin-1")
            elif kind == _HOST:
                out.host = value.decode("latin-1")
            elif kind == _CONNECTION:
                if connection_tokens is None:
                    connection_tokens = []
                connection_tokens.extend(
                    t.strip().lower() for t in value.decode("latin-1").split(",")
                )
            elif kind == _GATEWAY:
                out.gateway_authorization = value.decode("latin-1")
            continue
        if kind == _CONTENT_TYPE:
            out.content_type = value
        elif kind == _FORWARDED_PROTO:
            out.forwarded_proto = value.decode("latin-1")
        elif kind == _FORWARDED_HOST:
            out.forwarded_host = value.decode("latin-1")
        text = value.decode("latin-1")
        previous = tags.get(key)
        tags[key] = text if previous is None else f"{previous}, {text}"
    if connection_tokens:
        for token in connection_tokens:
            # Headers named in Connection are hop-by-hop for this connection only
            # (RFC 9110 7.6.1).
            if token and token not in ("close", "keep-alive"):
                tags.pop(HDR_TAG_PREFIX + token, None)
    return out


class _OutboundRules:
    """Which envelope tags :func:`outbound_headers` replays, for one caller-identity header
    name: tag key -> header name, or None (not a header tag, the caller-identity header, or
    ``Authorization`` without passthrough); decided once per key."""

    __slots__ = ("source", "caller_name", "plain", "passthrough")

    def __init__(self, caller_header: str) -> None:
        self.source = caller_header
        self.caller_name = _caller_header(caller_header)[1][len(HDR_TAG_PREFIX):]
        self.plain: dict[str, str | None] = {}
        self.passthrough: dict[str, str | None] = {}

    def decide(self, key: str, passthrough: bool) -> str | None:
        name: str | None = None
        if key.startswith(HDR_TAG_PREFIX):
            name = key[len(HDR_TAG_PREFIX):]
            # Defence in depth: the gateway never packs these, but tags may come from other
            # transports.
            if name == self.caller_name or (not passthrough and name == "authorization"):
                name = None
        cache = self.passthrough if passthrough else self.plain
        if len(cache) < _CACHE_LIMIT:
            cache[key] = name
        return name


_outbound_rules = _OutboundRules(conf.active.A2A_CALLER_ID_HEADER)
_NO_TAG = object()


def outbound_headers(
    tags: dict[str, str], caller_id: str, *, passthrough: bool = False
) -> dict[str, str]:
    """The headers of the subscriber's outbound request, replayed from the envelope's tags.

    ``Authorization`` is replayed only for an agent with credential passthrough. What to do
    with a tag is decided once per key (:class:`_OutboundRules`): one dict lookup per tag.
    """
    global _outbound_rules
    rules = _outbound_rules
    caller_header = conf.active.A2A_CALLER_ID_HEADER
    if rules.source != caller_header:  # a node started with other settings, or a test
        rules = _outbound_rules = _OutboundRules(caller_header)
    names = rules.passthrough if passthrough else rules.plain
    headers = {}
    for key, value in tags.items():
        name = names.get(key, _NO_TAG)
        if name is _NO_TAG:
            name = rules.decide(key, passthrough)
        if name is not None:
            headers[name] = value
    headers[caller_header] = caller_id
    return headers  # type: ignore[return-value]  # names: str once not _NO_TAG


# --- response headers ---------------------------------------------------------------------


class _ResponseRules:
    """The dropped response header names and prefixes (built-ins plus the setting), and the
    per-name decisions made so far: name as the agent sent it -> lowercase name, or None."""

    __slots__ = ("source", "names", "prefixes", "plain", "passthrough")

    def __init__(self, extra_names: tuple[str, ...]) -> None:
        #: The setting's value these rules were built from (``A2A_DROP_RESPONSE_HEADERS``).
        self.source = extra_names
        extra = [n.strip().lower().encode("latin-1") for n in extra_names if n.strip()]
        self.names = DROPPED_RESPONSE_HEADERS | {n for n in extra if not n.endswith(b"*")}
        self.prefixes = DROPPED_RESPONSE_PREFIXES + tuple(n[:-1] for n in extra if n.endswith(b"*"))
        self.plain: dict[bytes, bytes | None] = {}
        self.passthrough: dict[bytes, bytes | None] = {}

    def decide(self, name: bytes, passthrough: bool) -> bytes | None:
        lowered = name.lower()
        if lowered in self.names:
            keep = passthrough and lowered in _PASSTHROUGH_RELAYED
        else:
            keep = not lowered.startswith(self.prefixes)
        decision = lowered if keep else None
        cache = self.passthrough if passthrough else self.plain
        if len(cache) < _CACHE_LIMIT:
            cache[name] = decision
        return decision


_rules = _ResponseRules(conf.active.A2A_DROP_RESPONSE_HEADERS)
_MISS = b"\x00"


def _response_rules() -> _ResponseRules:
    """The rules of the active settings (rebuilt only when ``A2A_DROP_RESPONSE_HEADERS``
    changed: a node started with other settings, or a test changed the setting)."""
    global _rules
    rules = _rules
    extra = conf.active.A2A_DROP_RESPONSE_HEADERS
    if rules.source is not extra:
        rules = _rules = _ResponseRules(extra)
    return rules


def relayed_response_headers(
    raw: tuple[tuple[bytes, bytes], ...] | list[tuple[bytes, bytes]], passthrough: bool = False
) -> list[tuple[bytes, bytes]]:
    """The agent's response headers to relay to the caller (lowercase names)."""
    rules = _response_rules()
    cache = rules.passthrough if passthrough else rules.plain
    out = []
    for name, value in raw:
        lowered = cache.get(name, _MISS)
        if lowered is _MISS:
            lowered = rules.decide(name, passthrough)
        if lowered is not None:
            out.append((lowered, value))
    return out
