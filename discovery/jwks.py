"""Fetch a trusted JWKS URL for card signature checks (docs/signatures.md).

The one place a JWKS is fetched: discovery's shared synchronous HTTP client, a conditional GET
(``If-None-Match``) so an unchanged key set costs a 304, a timeout and a size cap. Which URLs
are fetched, and when, is decided by :mod:`registry.signatures` (only the configured
``A2A_CARD_JWKS_URLS``); the discovery app installs this function there at start.
"""

from __future__ import annotations

import httpx
from django.conf import settings

from discovery import http
from registry.signatures import MAX_JWKS_BYTES, JwksResponse


def jwks_fetch(url: str, etag: str = "") -> JwksResponse:
    """GET ``url`` (revalidating ``etag``); never raises for network or HTTP errors."""
    headers = {"Accept": "application/jwk-set+json, application/json"}
    if etag:
        headers["If-None-Match"] = etag
    timeout = httpx.Timeout(
        settings.DISCOVERY_FETCH_TIMEOUT_SECONDS, connect=settings.DISCOVERY_CONNECT_TIMEOUT_SECONDS
    )
    try:
        with http.sync_client().stream("GET", url, headers=headers, timeout=timeout) as resp:
            common = {
                "etag": resp.headers.get("etag", ""),
                "cache_control": resp.headers.get("cache-control", ""),
            }
            if resp.status_code != 200:
                return JwksResponse(
                    status=resp.status_code, error=f"HTTP {resp.status_code}", **common
                )
            body = bytearray()
            for chunk in resp.iter_bytes():
                body += chunk
                if len(body) > MAX_JWKS_BYTES:
                    return JwksResponse(status=None, error=f"larger than {MAX_JWKS_BYTES} bytes")
            return JwksResponse(status=200, body=bytes(body), **common)
    except httpx.HTTPError as exc:
        return JwksResponse(status=None, error=f"{type(exc).__name__}: {exc}".rstrip(": "))
