"""Tenants (docs/tenants.md): created by a platform operator; everything else belongs to one."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from registry import events
from registry.ids import split_agent_key, tenant_error
from registry.models import Agent, AgentTombstone, Tenant
from registry.permissions import Actor, PermissionDenied
from registry.quotas import check_tenant_quotas
from registry.selectors import agent_route
from registry.services.errors import AgentNotFound, InvalidInput


def tenant_create(*, slug: str, name: str = "", actor: Actor | None = None) -> Tenant:
    """Create a tenant (a platform admin's act: ``actor`` None is the operator's shell)."""
    if actor is not None and not actor.is_platform_admin:
        raise PermissionDenied("only a platform admin creates tenants")
    error = tenant_error(slug)
    if error:
        raise InvalidInput(error)
    if Tenant.objects.filter(slug=slug).exists():
        raise InvalidInput(f"a tenant named {slug!r} exists already")
    tenant = Tenant.objects.create(slug=slug, name=(name or slug)[:200])
    events.audit(events.AuditRecord(action="tenant.created",
                                    actor=actor.client_id if actor else "system",
                                    tenant=slug, details={"name": tenant.name}))
    return tenant


def agent_move_tenant(*, actor: Actor, agent_id: str, tenant: str) -> Agent:
    """Move an agent (its routing key ``agent_id``) to ``tenant``: a platform admin's act. Its
    routing key becomes the new tenant's; the old key is deregistered everywhere (event and
    tombstone, as a deregistration) and the new one registered. It loses its owner (an API
    client of the old tenant); its statistics and audit rows stay under the old key. Refused:
    an unknown tenant, an id the tenant has already, the tenant's quotas."""
    if not actor.is_platform_admin:
        raise PermissionDenied("only a platform admin moves agents between tenants")
    source, bare = split_agent_key(agent_id)
    with transaction.atomic():
        if not Tenant.objects.filter(slug=tenant).exists():
            raise InvalidInput(f"unknown tenant {tenant!r}")
        agent = Agent.objects.select_for_update().filter(tenant_id=source, agent_id=bare).first()
        if agent is None:
            raise AgentNotFound(agent_id)
        if source == tenant:
            return agent
        if Agent.objects.filter(tenant_id=tenant, agent_id=bare).exists():
            raise InvalidInput(f"tenant {tenant} has an agent {bare!r} already")
        check_tenant_quotas(tenant, card_bytes=len(agent.card_raw.encode()), new_agent=True)
        old_key = agent.key
        agent.tenant_id, agent.owner = tenant, None
        agent.routing_changed_at = timezone.now()
        agent.save(update_fields=["tenant", "owner", "routing_changed_at"])
        AgentTombstone.objects.create(tenant_id=source, agent_id=bare)
        events.publish(events.AgentEvent(kind="deregistered", agent_id=old_key))
        events.publish(events.AgentEvent(kind="registered", agent_id=agent.key,
                                         route=agent_route(agent)))
        for where in (source, tenant):
            events.audit(events.AuditRecord(
                action="agent.moved", actor=actor.client_id, agent_id=agent.key, tenant=where,
                details={"from": old_key, "to": agent.key}))
    return agent
