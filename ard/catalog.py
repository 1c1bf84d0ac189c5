"""``/.well-known/ai-catalog.json``: this registry's ARD capability manifest (ARD §4.1).

One ``application/a2a-agent-card+json`` entry per routable agent the caller may see
(anonymous: the public ones), pointing at the gateway's rewritten card, plus one
``application/ai-registry+json`` entry for the ARD API, under the ``host`` block from settings.
The bytes and their ETag are cached per (tier, base URL, settings, index fingerprint); the
fingerprint is one aggregate query, so a registration, deregistration, expiry or change of a
public flag shows at once.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import orjson
from django.db.models import Count, Max, Sum

from ard import documents
from ard.selectors import actor_key, visible_docs
from registry.permissions import Actor

SPEC_VERSION = "1.0"
MAX_CACHED = 64
_cache: dict[tuple, tuple[bytes, str]] = {}
_lock = threading.Lock()


def catalog_document(*, actor: Actor | None, base_url: str) -> dict[str, Any]:
    """The manifest as a dict (tests and the benchmark; the view serves the cached bytes)."""
    return orjson.loads(catalog_bytes(actor=actor, base_url=base_url)[0])


def _render(actor: Actor | None, base_url: str) -> bytes:
    entries = [
        documents.render_entry(entry, base_url)
        for entry in visible_docs(actor)
        .order_by("agent_id")
        .values_list("entry", flat=True)
        .iterator(chunk_size=2000)
    ]
    entries.append(documents.registry_entry(base_url))
    return orjson.dumps(
        {
            "specVersion": SPEC_VERSION,
            "host": documents.host_block(),
            "entries": entries,
        }
    )


def catalog_bytes(*, actor: Actor | None, base_url: str) -> tuple[bytes, str]:
    """The manifest's bytes and strong ETag (over those bytes)."""
    stats = visible_docs(actor).aggregate(n=Count("pk"), t=Max("updated_at"), s=Sum("pk"))
    key = (
        actor_key(actor),
        base_url,
        documents.urn_prefix(),
        tuple(sorted(documents.host_block().items())),
        stats["n"],
        stats["t"],
        stats["s"],
    )
    hit = _cache.get(key)
    if hit is None:
        body = _render(actor, base_url)
        hit = (body, '"' + hashlib.sha256(body).hexdigest()[:32] + '"')
        with _lock:
            if len(_cache) >= MAX_CACHED:
                _cache.clear()
            _cache[key] = hit
    return hit
