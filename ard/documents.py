"""Catalog entries (ARD §4.2) for registered agents, and the host block, from settings.

An agent's entry: ``identifier`` a domain-anchored URN (``urn:air:<host>:<namespace>:<agent id>``,
the naming guide's form), ``type`` ``application/a2a-agent-card+json``, ``url`` the gateway's
rewritten card for it, ``displayName``/``description`` from the card, ``tags`` from its skills'
tags, ``capabilities`` its skill ids, ``representativeQueries`` its skills' examples (2 to 5, as
the schema requires; omitted when the card has fewer than 2), ``version`` the card's.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from registry.ids import gateway_path

A2A_CARD_TYPE = "application/a2a-agent-card+json"
REGISTRY_TYPE = "application/ai-registry+json"
CATALOG_TYPE = "application/ai-catalog+json"
API_PATH = "/ard/v1/"
PLACEHOLDER_HOST = "agent.localhost"
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_DOMAIN_RE = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})+$")
_SEGMENT_RE = re.compile(r"^[A-Za-z0-9._-]+$")
MAX_QUERIES = 5


def _is_domain(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return False
    except ValueError:
        return bool(_DOMAIN_RE.match(host))


def publisher_host() -> str:
    """The URN publisher: ``ARD_PUBLIC_HOST``, else the public base URL's domain, else the
    RFC 2606 placeholder ``agent.localhost``."""
    if settings.ARD_PUBLIC_HOST:
        return settings.ARD_PUBLIC_HOST
    host = (urlsplit(settings.A2A_PUBLIC_BASE_URL).hostname or "").lower().rstrip(".")
    return host if host and _is_domain(host) else PLACEHOLDER_HOST


def urn_prefix() -> str:
    namespace = settings.ARD_URN_NAMESPACE.strip(":")
    return (
        f"urn:air:{publisher_host()}:{namespace}:" if namespace else f"urn:air:{publisher_host()}:"
    )


def agent_identifier(agent_id: str) -> str:
    return urn_prefix() + agent_id


def agent_id_from_identifier(identifier: str) -> str | None:
    prefix = urn_prefix()
    return identifier[len(prefix) :] if identifier.startswith(prefix) else None


def publisher_of(identifier: str) -> str:
    """The ``<publisher>`` segment of a ``urn:air:`` identifier (ARD §7.1's ``publisher`` key)."""
    parts = identifier.split(":")
    return parts[2].lower() if len(parts) > 3 and parts[0] == "urn" and parts[1] == "air" else ""


def check_settings() -> list[str]:
    """Problems with the ARD settings (shown by the reindex command, tested)."""
    problems = []
    if not _is_domain(publisher_host()):
        problems.append(f"ARD_PUBLIC_HOST {publisher_host()!r} is not a domain name")
    namespace = settings.ARD_URN_NAMESPACE.strip(":")
    if namespace and not all(_SEGMENT_RE.match(s) for s in namespace.split(":")):
        problems.append(f"ARD_URN_NAMESPACE {namespace!r}: letters, digits, . _ - and :")
    return problems


def host_block() -> dict[str, str]:
    """The catalog's ``host`` (ARD §4.3), from settings; empty optional fields are left out."""
    block = {"displayName": settings.ARD_HOST_DISPLAY_NAME}
    for key, value in (
        ("identifier", settings.ARD_HOST_IDENTIFIER),
        ("documentationUrl", settings.ARD_HOST_DOCUMENTATION_URL),
        ("logoUrl", settings.ARD_HOST_LOGO_URL),
    ):
        if value:
            block[key] = value
    return block


def registry_entry(base_url: str) -> dict[str, Any]:
    """This registry's own ``application/ai-registry+json`` entry (ARD §7: how clients find the
    API's base URL)."""
    return {
        "identifier": f"urn:air:{publisher_host()}:registry:ard",
        "displayName": f"{settings.ARD_HOST_DISPLAY_NAME} (ARD search)",
        "type": REGISTRY_TYPE,
        "url": base_url + API_PATH,
        "description": "ARD registry API: POST search, GET agents, POST explore over the "
        "A2A agents of this registry.",
        "tags": ["registry", "search", "a2a"],
    }


def card_url(base_url: str, agent_id: str) -> str:
    """The gateway's rewritten card for the agent (its endpoints point at the gateway;
    ``agent_id``: its routing key, registry.ids.agent_key)."""
    return f"{base_url}{gateway_path(agent_id)}.well-known/agent-card.json"


def _strings(values: Any) -> list[str]:
    return (
        [v for v in values if isinstance(v, str) and v.strip()] if isinstance(values, list) else []
    )


def _dedupe(values: list[str]) -> list[str]:
    return list(dict.fromkeys(v.strip() for v in values if v.strip()))


def build_document(
    *, agent_id: str, card: dict[str, Any], name: str, description: str, updated_at: datetime
) -> dict[str, Any]:
    """The index document of an agent: its catalog entry (no URL) and its searchable text."""
    skills = [s for s in card.get("skills") or [] if isinstance(s, dict)]
    skill_ids = _dedupe([s.get("id") for s in skills if isinstance(s.get("id"), str)])  # type: ignore[misc]  # str only
    skill_names = _dedupe([s.get("name") for s in skills if isinstance(s.get("name"), str)])  # type: ignore[misc]  # str only
    skill_descs = _dedupe(
        [s.get("description") for s in skills if isinstance(s.get("description"), str)]  # type: ignore[misc]  # str only
    )
    tags = _dedupe([t for s in skills for t in _strings(s.get("tags"))])
    examples = _dedupe([e for s in skills for e in _strings(s.get("examples"))])
    entry: dict[str, Any] = {
        "identifier": agent_identifier(agent_id),
        "displayName": name or agent_id,
        "type": A2A_CARD_TYPE,
    }
    if description:
        entry["description"] = description
    if tags:
        entry["tags"] = tags
    if skill_ids:
        entry["capabilities"] = skill_ids
    if len(examples) >= 2:
        entry["representativeQueries"] = examples[:MAX_QUERIES]
    if isinstance(card.get("version"), str) and card["version"]:
        entry["version"] = card["version"]
    entry["updatedAt"] = updated_at.isoformat().replace("+00:00", "Z")
    entry["metadata"] = {"agentId": agent_id}
    return {
        "entry": entry,
        "name": name or agent_id,
        "description": description,
        "skill_names": "\n".join(skill_names + skill_ids),
        "skill_descriptions": "\n".join(skill_descs),
        "tags": " ".join(tags),
        "examples": "\n".join(examples),
        "tags_index": _index(tags),
        "capabilities_index": _index(skill_ids),
    }


def _index(values: list[str]) -> str:
    return "|" + "|".join(v.replace("|", "") for v in values) + "|" if values else ""


def render_entry(stored: dict[str, Any], base_url: str) -> dict[str, Any]:
    """A stored entry with its ``url`` (the gateway's card URL for ``base_url``) put back.

    Identifier and URL come first so the entry reads as the spec's examples do."""
    agent_id = stored.get("metadata", {}).get("agentId", "")
    # Recomputed, not stored: a change of ARD_PUBLIC_HOST needs no rebuild.
    out = {
        "identifier": agent_identifier(agent_id),
        "displayName": stored["displayName"],
        "type": stored["type"],
        "url": card_url(base_url, agent_id),
    }
    out.update((k, v) for k, v in stored.items() if k not in out)
    return out
