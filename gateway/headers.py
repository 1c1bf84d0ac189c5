"""Header rules: which caller headers travel to the agent, and which agent headers come back.

Each forwarded caller header rides in the Query envelope as the tag ``a2a_hdr_<name>`` and the
virtual subscriber replays it on the outbound request. Hop-by-hop and sensitive headers never
travel; the caller-identity header is always set by the subscriber from the authenticated
caller, never taken from the caller.
"""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings

from gateway import conf

HDR_TAG_PREFIX = "a2a_hdr_"

#: Never forwarded to the agent (lowercase, as ASGI delivers names).
DROPPED_REQUEST_HEADERS = frozenset({
    b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade", b"host",
    b"content-length", b"authorization", b"cookie", b"set-cookie", b"proxy-authorization",
    b"proxy-authenticate", b"x-forwarded-for", b"x-real-ip",
})

#: Never relayed from the agent back to the caller: hop-by-hop, framing (the gateway sets its
#: own), the gateway's own server/date, cookies for the gateway's origin, and the gateway's
#: X-A2A-* reply headers (an agent must not be able to forge X-A2A-Executed).
DROPPED_RESPONSE_HEADERS = frozenset({
    b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade",
    b"content-length", b"proxy-authenticate", b"set-cookie", b"server", b"date",
    b"x-a2a-executed", b"x-a2a-agent-status",
})


_TAG_KEYS: dict[bytes, str] = {}


def _tag_key(name: bytes) -> str:
    key = _TAG_KEYS.get(name)
    if key is None:
        key = HDR_TAG_PREFIX + name.decode("latin-1").lower()
        if len(_TAG_KEYS) < 4096:
            _TAG_KEYS[name] = key
    return key


@lru_cache(maxsize=8)
def _caller_header(name: str) -> tuple[bytes, str]:
    return name.lower().encode("latin-1"), HDR_TAG_PREFIX + name.lower()


def caller_id_header() -> str:
    """The header name carrying the caller's identity to agents (configurable)."""
    return settings.A2A_CALLER_ID_HEADER


class RequestHeaders:
    """What the gateway reads from a caller's headers, found in one pass."""

    __slots__ = ("content_type", "content_length", "authorization", "host", "tags",
                 "forwarded_proto", "forwarded_host")

    def __init__(self) -> None:
        self.content_type: bytes = b""
        self.content_length: int | None = None
        self.authorization: str | None = None
        self.host: str = ""
        self.forwarded_proto: str = ""
        self.forwarded_host: str = ""
        self.tags: dict[str, str] = {}


def scan_request_headers(raw: list[tuple[bytes, bytes]]) -> RequestHeaders:
    """Read the framing/auth headers and build the ``a2a_hdr_*`` tags of the forwarded ones.

    Invalid Content-Length makes ``content_length`` -1 (the caller answers 400-ish -32700).
    Repeated headers are joined with ", " as HTTP allows.
    """
    out = RequestHeaders()
    tags = out.tags
    caller_name = _caller_header(conf.active.A2A_CALLER_ID_HEADER)[0]
    connection_tokens: list[str] = []
    for name, value in raw:
        if name in DROPPED_REQUEST_HEADERS:
            if name == b"content-length":
                try:
                    out.content_length = int(value)
                except ValueError:
                    out.content_length = -1
            elif name == b"authorization":
                out.authorization = value.decode("latin-1")
            elif name == b"host":
                out.host = value.decode("latin-1")
            elif name == b"connection":
                connection_tokens.extend(
                    t.strip().lower() for t in value.decode("latin-1").split(",")
                )
            continue
        if name == caller_name:
            continue
        if name == b"content-type":
            out.content_type = value
        elif name == b"x-forwarded-proto":
            out.forwarded_proto = value.decode("latin-1")
        elif name == b"x-forwarded-host":
            out.forwarded_host = value.decode("latin-1")
        key = _tag_key(name)
        text = value.decode("latin-1")
        previous = tags.get(key)
        tags[key] = text if previous is None else f"{previous}, {text}"
    for token in connection_tokens:
        # Headers named in Connection are hop-by-hop for this connection only (RFC 9110 7.6.1).
        if token and token not in ("close", "keep-alive"):
            tags.pop(HDR_TAG_PREFIX + token, None)
    return out


def outbound_headers(tags: dict[str, str], caller_id: str) -> dict[str, str]:
    """The headers of the subscriber's outbound request, replayed from the envelope's tags."""
    start = len(HDR_TAG_PREFIX)
    headers = {
        key[start:]: value for key, value in tags.items() if key.startswith(HDR_TAG_PREFIX)
    }
    caller_name, caller_tag = _caller_header(conf.active.A2A_CALLER_ID_HEADER)
    # Defence in depth: the gateway never packs it, but tags may come from other transports.
    headers.pop(caller_tag[start:], None)
    headers[conf.active.A2A_CALLER_ID_HEADER] = caller_id
    return headers


def relayed_response_headers(raw: tuple[tuple[bytes, bytes], ...]) -> list[tuple[bytes, bytes]]:
    """The agent's response headers to relay to the caller (lowercase names)."""
    out = []
    for name, value in raw:
        lowered = name.lower()
        if lowered not in DROPPED_RESPONSE_HEADERS:
            out.append((lowered, value))
    return out
