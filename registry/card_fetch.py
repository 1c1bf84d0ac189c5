"""Fetch an agent's card for a registration by URL (no card given).

Where the card is looked for, per the A2A convention: a URL that names a card (its path ends
in ``.json``, e.g. ``…/.well-known/agent-card.json``) is fetched as it is; any other URL is the
agent's base, and its card is at ``<url>/.well-known/agent-card.json``, relative to the URL's
path. For a URL with a path, the host root's card is taken only when that card's own
``url``/interfaces name the URL (an agent mounted under a path whose card is served at the
root): a URL that is not an agent never borrows another agent's card (the node's own card, say).

What is fetched must be a card: a JSON object with a ``name`` and a ``url`` or at least one
interface with a URL; anything else (an HTML index answered with 200, ``{}``) is refused, and
the error says what each place answered.

One shared synchronous httpx client per process, built by the outbound layer
(``outbound.clients``): the system trust store plus ``A2A_OUTBOUND_CA_FILE`` (an agent behind a
private CA can be registered by URL, as it can be called), the policy's proxy, redirects off,
and the connect-time address check (a name resolving to a refused address is never reached).
"""

from __future__ import annotations

import os
import threading
from urllib.parse import urlsplit, urlunsplit

import httpx
import orjson
from django.conf import settings

from outbound import clients
from outbound import policy as outbound_policy

WELL_KNOWN_CARD_PATH = "/.well-known/agent-card.json"

_lock = threading.Lock()
_shared: dict[str, object] = {}


class CardFetchError(Exception):
    """The card could not be fetched; the message says why."""


def names_a_card(url: str) -> bool:
    """Whether ``url`` is the address of a card document rather than of an agent."""
    return urlsplit(url).path.lower().endswith(".json")


def card_urls(base_url: str) -> list[str]:
    """Where to look, in order: the URL itself when it names a card; else under the URL's
    path, then (a URL with a path only) at the origin's root, whose card must name the URL."""
    if names_a_card(base_url):
        return [base_url]
    parts = urlsplit(base_url)
    under_path = urlunsplit(
        (parts.scheme, parts.netloc, parts.path.rstrip("/") + WELL_KNOWN_CARD_PATH, "", "")
    )
    at_root = urlunsplit((parts.scheme, parts.netloc, WELL_KNOWN_CARD_PATH, "", ""))
    return list(dict.fromkeys([under_path, at_root]))


def _same_url(a: str, b: str) -> bool:
    pa, pb = urlsplit(a), urlsplit(b)
    return (
        (pa.scheme.lower(), pa.netloc.lower(), pa.path.rstrip("/"))
        == (pb.scheme.lower(), pb.netloc.lower(), pb.path.rstrip("/"))
    )


def card_interface_urls(card: dict) -> list[str]:
    """Every endpoint URL the card names: ``url`` and each interface's ``url``."""
    urls = [card["url"]] if isinstance(card.get("url"), str) and card["url"] else []
    for key in ("supportedInterfaces", "additionalInterfaces"):
        ifaces = card.get(key)
        for iface in ifaces if isinstance(ifaces, list) else []:
            if isinstance(iface, dict) and isinstance(iface.get("url"), str) and iface["url"]:
                urls.append(iface["url"])
    return urls


def not_a_card(body: bytes) -> str | None:
    """Why ``body`` is not an A2A card (None when it is one): every A2A version requires a
    JSON object with a name and an endpoint (``url``, or an interface with a ``url``)."""
    try:
        card = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "not JSON"
    if not isinstance(card, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean"}.get(type(card), "a number")
        return f"JSON, but {'null' if card is None else kind}, not an object"
    if not isinstance(card.get("name"), str) or not card["name"].strip():
        return "a JSON object without a name"
    if not card_interface_urls(card):
        return "a JSON object without a url or an interface"
    return None


def _client() -> httpx.Client:
    """The process's card-fetch client (rebuilt after a fork or a change of outbound policy)."""
    policy = outbound_policy.current()
    key = (os.getpid(), policy)
    client = _shared.get("client")
    if client is None or _shared.get("key") != key:
        with _lock:
            client = _shared.get("client")
            if client is None or _shared.get("key") != key:
                client = clients.httpx_client(
                    timeout=httpx.Timeout(5.0, connect=3.0),
                    limits=httpx.Limits(max_connections=20, keepalive_expiry=30),
                )
                _shared.update(client=client, key=key)
    return client  # type: ignore[return-value]  # _shared["client"] is a client


def _get(client: httpx.Client, url: str, timeout: httpx.Timeout, limit: int) -> bytes | str:
    """The body of a 200 answer that is a card, or a sentence saying what ``url`` answered."""
    try:
        with client.stream(
            "GET", url, headers={"Accept": "application/json"}, timeout=timeout
        ) as resp:
            kind = resp.headers.get("content-type", "").split(";")[0].strip() or "no content type"
            if resp.status_code != 200:
                return f"{url} answered HTTP {resp.status_code} ({kind})"
            body = bytearray()
            for chunk in resp.iter_bytes():
                body += chunk
                if len(body) > limit:
                    raise CardFetchError(f"{url}: card is larger than {limit} bytes")
    except httpx.TimeoutException:
        return f"{url}: timed out"
    except httpx.HTTPError as exc:
        return f"{url}: {type(exc).__name__}: {exc}".rstrip(": ")
    why = not_a_card(bytes(body))
    if why:
        return f"{url} answered HTTP 200 {kind}, not an A2A card ({why})"
    return bytes(body)


def fetch_card_bytes(base_url: str) -> bytes:
    """GET the card for ``base_url`` (timeout and size cap from settings); raise
    CardFetchError saying what each place answered when there is none."""
    limit = settings.A2A_MAX_CARD_BYTES
    timeout = httpx.Timeout(settings.A2A_CARD_FETCH_TIMEOUT_SECONDS, connect=3.0)
    errors: list[str] = []
    client = _client()
    for i, url in enumerate(card_urls(base_url)):
        got = _get(client, url, timeout, limit)
        if isinstance(got, str):
            errors.append(got)
            continue
        if i > 0:  # the host root's card: only the card of the agent the URL names
            named = card_interface_urls(orjson.loads(got))
            if not any(_same_url(u, base_url) for u in named):
                errors.append(
                    f"{url} is the card of another agent (its interfaces name "
                    f"{', '.join(named[:3])}, not {base_url})"
                )
                continue
        return got
    raise CardFetchError(f"could not fetch an A2A agent card for {base_url}: " + "; ".join(errors))
