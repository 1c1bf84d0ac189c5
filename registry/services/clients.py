"""API clients: create (the token is seen once) and change."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from registry import events
from registry.ids import DEFAULT_TENANT, agent_name_error
from registry.models import ApiClient, Tenant
from registry.permissions import ALL_SCOPES, Actor
from registry.services.errors import InvalidInput

_UNSET: Any = object()


def _checked_scopes(scopes: list[str]) -> list[str]:
    bad = [s for s in scopes if s not in ALL_SCOPES]
    if bad or not scopes:
        raise InvalidInput(f"scopes must be among {', '.join(ALL_SCOPES)}; got {scopes!r}")
    return list(dict.fromkeys(scopes))


def _checked_agent_ids(agent_ids: list[str]) -> list[str]:
    for agent_id in agent_ids:
        error = agent_name_error(agent_id)
        if error:
            raise InvalidInput(error)
    return list(dict.fromkeys(agent_ids))


def api_client_create(
    *,
    name: str,
    scopes: list[str],
    allowed_agents: list[str] | None = None,
    client_id: str | None = None,
    actor: Actor | None = None,
    tenant: str = DEFAULT_TENANT,
) -> tuple[ApiClient, str]:
    """Create an API client of ``tenant``; returns it and its token (the only time the token
    is seen)."""
    from django.utils.text import slugify

    checked_scopes = _checked_scopes(scopes)
    allowed = _checked_agent_ids(allowed_agents or [])
    cid = client_id or slugify(name)[:100]
    if not cid:
        raise InvalidInput("name must contain letters or digits")
    if ApiClient.objects.filter(client_id=cid).exists():
        raise InvalidInput(f"a client named {cid!r} exists already")
    if not Tenant.objects.filter(slug=tenant).exists():
        raise InvalidInput(f"unknown tenant {tenant!r} (create it first: manage.py tenants "
                           "create)")
    created: tuple[ApiClient, str] = ApiClient.objects.create_key(  # type: ignore[assignment]  # manager typed for the abstract model
        name=name[:50],
        client_id=cid,
        scopes=checked_scopes,
        allowed_agents=allowed,
        tenant_id=tenant,
    )
    events.audit(
        events.AuditRecord(
            action="client.created",
            actor=actor.client_id if actor else "system",
            client_id=cid,
            tenant=tenant,
            details={"scopes": created[0].scopes, "allowed_agents": allowed},
        )
    )
    return created


def api_client_update(
    *,
    client_id: str,
    name: str | None = None,
    scopes: list[str] | None = None,
    allowed_agents: list[str] | None = None,
    revoked: bool | None = None,
    expiry_date: Any = _UNSET,
    actor: Actor | None = None,
) -> ApiClient:
    """Change a client's name, scopes, allowed agents or expiry, or revoke it (for good).

    The token and the ``client_id`` never change. Callers caching tokens see the change within
    their cache lifetime (``A2A_AUTH_CACHE_SECONDS``).
    """
    with transaction.atomic():
        client = ApiClient.objects.select_for_update().filter(client_id=client_id).first()
        if client is None:
            raise InvalidInput(f"no client {client_id!r}")
        fields: list[str] = []
        if name is not None:
            if not name.strip():
                raise InvalidInput("name is required")
            client.name = name.strip()[:50]
            fields.append("name")
        if scopes is not None:
            client.scopes = _checked_scopes(scopes)
            fields.append("scopes")
        if allowed_agents is not None:
            client.allowed_agents = _checked_agent_ids(allowed_agents)
            fields.append("allowed_agents")
        if revoked is not None and revoked != client.revoked:
            if not revoked:
                raise InvalidInput("a revoked client cannot be restored")
            client.revoked = True
            fields.append("revoked")
        if expiry_date is not _UNSET:
            client.expiry_date = expiry_date
            fields.append("expiry_date")
        if fields:
            client.save(update_fields=fields)
            events.audit(
                events.AuditRecord(
                    action="client.revoked" if "revoked" in fields else "client.updated",
                    actor=actor.client_id if actor else "system",
                    client_id=client_id,
                    details={"fields": fields},
                )
            )
    return client
