"""The resolver: merges the sources' records, removes duplicates by normalised base URL, and
admits only hosts on the allowlist (https unless the host is explicitly allowed plain http).

A source proposes; only the allowlist admits. Cloud-metadata and link-local addresses are
always refused (``registry.netcheck``), whatever the allowlist says. Local names must be unique
(and so must the agent ids derived from them): the first record keeps a name, configured
records first; a later one is refused as a collision.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from discovery.models import AllowedHost
from discovery.records import EndpointRecord
from registry.netcheck import UnsafeUrl, check_agent_url, host_allowed

DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class AllowEntry:
    host: str
    allow_http: bool


@dataclass
class ResolveResult:
    admitted: list[EndpointRecord] = field(default_factory=list)
    refused: list[tuple[EndpointRecord, str]] = field(default_factory=list)
    collisions: list[tuple[EndpointRecord, EndpointRecord]] = field(default_factory=list)
    duplicates: int = 0


def normalise_base_url(url: str) -> str:
    """Lowercase scheme and host, no default port, no trailing slash, query or fragment."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower().rstrip(".")
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = host if port in (None, DEFAULT_PORTS.get(scheme)) else f"{host}:{port}"
    return urlunsplit((scheme, netloc, parts.path.rstrip("/"), "", ""))


def allowlist_entries() -> list[AllowEntry]:
    return [AllowEntry(h, a) for h, a in AllowedHost.objects.values_list("host", "allow_http")]


class Admission:
    """Allowlist decisions, memoised per (scheme, host) for one cycle."""

    def __init__(self, entries: Iterable[AllowEntry]) -> None:
        self.entries = list(entries)
        self._memo: dict[tuple[str, str], str | None] = {}

    def refusal(self, url: str) -> str | None:
        """Why ``url`` is not admitted, or None when it is."""
        try:
            parts = urlsplit(url)
            scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
        except ValueError:
            return "not a valid URL"
        key = (scheme, host)
        if key not in self._memo:
            self._memo[key] = self._decide(url, scheme, host)
        return self._memo[key]

    def admits(self, url: str) -> bool:
        return self.refusal(url) is None

    def _decide(self, url: str, scheme: str, host: str) -> str | None:
        if scheme not in ("http", "https") or not host:
            return "only http(s) URLs with a host"
        matching = [e for e in self.entries if host_allowed(host, [e.host])]
        if not matching:
            return f"host {host} is not on the discovery allowlist"
        if scheme == "http" and not any(e.allow_http for e in matching):
            return f"https required for {host} (plain http is not allowed for it)"
        try:
            check_agent_url(url, allowlist=[e.host for e in matching])
        except UnsafeUrl as exc:
            return str(exc)
        return None


def resolve(
    records: Iterable[EndpointRecord], *, admission: Admission | None = None
) -> ResolveResult:
    """Merge, deduplicate and admit ``records`` (in priority order: configured first)."""
    admission = admission or Admission(allowlist_entries())
    result = ResolveResult()
    seen_urls: set[str] = set()
    by_name: dict[str, EndpointRecord] = {}
    by_agent_id: dict[str, EndpointRecord] = {}
    ordered = sorted(records, key=lambda r: (not r.configured,))  # stable: keeps source order
    for record in ordered:
        key = normalise_base_url(record.base_url)
        if key in seen_urls:
            result.duplicates += 1
            continue
        seen_urls.add(key)
        reason = admission.refusal(record.base_url)
        if reason:
            result.refused.append((record, reason))
            continue
        other = by_name.get(record.local_name) or by_agent_id.get(record.target_agent_id)
        if other is not None:
            result.collisions.append((record, other))
            continue
        by_name[record.local_name] = record
        by_agent_id[record.target_agent_id] = record
        result.admitted.append(record)
    return result
