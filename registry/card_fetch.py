"""Fetch an agent's card from its well-known path (registration without a card)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import httpx
from django.conf import settings

WELL_KNOWN_CARD_PATH = "/.well-known/agent-card.json"


class CardFetchError(Exception):
    """The card could not be fetched; the message says why."""


def card_urls(base_url: str) -> list[str]:
    """Where to look: under the agent URL's path first, then at the origin's root."""
    parts = urlsplit(base_url)
    under_path = base_url.rstrip("/") + WELL_KNOWN_CARD_PATH
    at_root = urlunsplit((parts.scheme, parts.netloc, WELL_KNOWN_CARD_PATH, "", ""))
    return list(dict.fromkeys([under_path, at_root]))


def fetch_card_bytes(base_url: str) -> bytes:
    """GET the card (timeout and size cap from settings); raise CardFetchError on failure."""
    limit = settings.A2A_MAX_CARD_BYTES
    timeout = httpx.Timeout(settings.A2A_CARD_FETCH_TIMEOUT_SECONDS, connect=3.0)
    errors: list[str] = []
    with httpx.Client(timeout=timeout, follow_redirects=False) as client:
        for url in card_urls(base_url):
            try:
                with client.stream("GET", url, headers={"Accept": "application/json"}) as resp:
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
