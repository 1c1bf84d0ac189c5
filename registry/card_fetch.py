"""Fetch an agent's card from its well-known path (registration without a card).

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
from django.conf import settings

from outbound import clients
from outbound import policy as outbound_policy

WELL_KNOWN_CARD_PATH = "/.well-known/agent-card.json"

_lock = threading.Lock()
_shared: dict[str, object] = {}


class CardFetchError(Exception):
    """The card could not be fetched; the message says why."""


def card_urls(base_url: str) -> list[str]:
    """Where to look: under the agent URL's path first, then at the origin's root."""
    parts = urlsplit(base_url)
    under_path = base_url.rstrip("/") + WELL_KNOWN_CARD_PATH
    at_root = urlunsplit((parts.scheme, parts.netloc, WELL_KNOWN_CARD_PATH, "", ""))
    return list(dict.fromkeys([under_path, at_root]))


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


def fetch_card_bytes(base_url: str) -> bytes:
    """GET the card (timeout and size cap from settings); raise CardFetchError on failure."""
    limit = settings.A2A_MAX_CARD_BYTES
    timeout = httpx.Timeout(settings.A2A_CARD_FETCH_TIMEOUT_SECONDS, connect=3.0)
    errors: list[str] = []
    client = _client()
    for url in card_urls(base_url):
        try:
            with client.stream(
                "GET", url, headers={"Accept": "application/json"}, timeout=timeout
            ) as resp:
                if resp.status_code != 200:
                    errors.append(f"{url}: HTTP {resp.status_code}")
                    continue
                body = bytearray()
                for chunk in resp.iter_bytes():
                    body += chunk
                    if len(body) > limit:
                        raise CardFetchError(f"{url}: card is larger than {limit} bytes")
                return bytes(body)
        except httpx.TimeoutException:
            errors.append(f"{url}: timed out")
        except httpx.HTTPError as exc:
            errors.append(f"{url}: {type(exc).__name__}: {exc}".rstrip(": "))
    raise CardFetchError("could not fetch the agent card: " + "; ".join(errors))
