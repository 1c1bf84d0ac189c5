"""Agents: register, update, deregister (each publishes its registry event after commit)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models.constants import OnConflict
from django.utils import timezone

from core import outage, tracing
from registry import events, rows
from registry.cards import ParsedCard
from registry.ids import agent_id_error, agent_key, agent_name_error
from registry.models import Agent, AgentTombstone, CardVersion, Tenant
from registry.permissions import SCOPE_REGISTER, Actor, PermissionDenied
from registry.quotas import (
    check_agent_quota,
    check_registration_rate,
    check_tenant_quotas,
    take_agent_quota,
    tenants_limited,
)
from registry.selectors import agent_route
from registry.services.cards import (
    _apply_card,
    _record_card_version,
    _resolve_card,
    _version_fields,
)
from registry.services.errors import AgentNotFound, InvalidInput, RegistrationConflict
from registry.services.fields import (
    UNSET,
    _check_concurrency,
    _check_passthrough,
    _check_push_relay,
    _check_ttl,
    _check_visibility,
    _set_shared,
)
from registry.services.nodes import _owning_node


def _authorize_register(actor: Actor, agent_id: str, existing: Agent | None,
                        tenant: str | None = None) -> None:
    """``agent_id``: the bare id in ``tenant`` (default: the actor's)."""
    tenant = actor.tenant if tenant is None else tenant
    if not actor.has_scope(SCOPE_REGISTER):
        raise PermissionDenied("this client lacks the register scope")
    if not actor.in_tenant(tenant):
        # Says nothing of the agents there: the same answer whether the id exists or not.
        raise PermissionDenied(f"this client may not register agents in tenant {tenant}")
    if not actor.may_touch(agent_key(tenant, agent_id)):
        raise PermissionDenied(f"this client may not register {agent_id}")
    if existing is not None and not _owns(actor, existing):
        raise PermissionDenied(f"{agent_id} belongs to another client")


def _owns(actor: Actor, agent: Agent) -> bool:
    if not actor.in_tenant(str(agent.tenant_id)):
        return False  # docs/tenants.md: another tenant's agents are managed by it alone
    if actor.is_admin:
        return True
    if actor.external:
        # A JWT caller is no API client and owns no row: it manages the unowned agents its
        # allowed-agents claim names (its register scope needs that claim: registry.identity).
        return agent.owner_id is None and agent.key in actor.allowed_keys
    return agent.owner_id == actor.api_client_pk  # anonymous owns the unowned


def _located(actor: Actor, agent_id: Any) -> tuple[str, str]:
    """``(tenant, agent_id)`` of the agent a caller names (``actor.locate``), the id checked;
    another tenant's agent out of the caller's management is :class:`AgentNotFound`, the same
    answer as an unknown id (docs/tenants.md)."""
    if not isinstance(agent_id, str):
        raise AgentNotFound(str(agent_id)[:80])
    tenant, bare = actor.locate(agent_id)
    if not actor.in_tenant(tenant):
        raise AgentNotFound(agent_id)
    return tenant, bare


def _publish(kind: events.EventKind, agent: Agent, actor: Actor | None = None) -> None:
    events.publish(_event(kind, agent, actor))


def _event(kind: events.EventKind, agent: Agent, actor: Actor | None = None,
           committed: bool = False) -> events.AgentEvent:
    """``committed``: the event carries ``agent`` itself for in-process subscribers (the
    search index), who then need not read back the row this transaction writes."""
    owner = {}
    if actor is not None and agent.owner_id is not None and \
            agent.owner_id == actor.api_client_pk:
        owner = {"owner_client_id": actor.client_id}  # the caller owns it: no owner read
    return events.AgentEvent(kind=kind, agent_id=agent.key,
                             route=agent_route(agent, **owner),
                             agent=agent if committed else None)


_LOCKED_SQL: dict[str, str] = {}


def _locked(agent_id: str, tenant: str) -> Agent | None:
    """The agent's row, locked for this transaction (``SELECT ... FOR UPDATE`` where the
    database has it, as ``select_for_update()``; SQLite's BEGIN IMMEDIATE already holds the
    write lock). The statement is built once per database vendor: compiling the ORM query
    cost more CPU than the rest of the registration's reads (py-spy on a loaded node)."""
    sql = _LOCKED_SQL.get(connection.vendor)
    if sql is None:
        quote = connection.ops.quote_name
        meta = Agent._meta
        columns = ", ".join(quote(f.column) for f in meta.concrete_fields)  # type: ignore[arg-type]  # concrete fields
        sql = (f"SELECT {columns} FROM {quote(meta.db_table)} "
               f"WHERE {quote(meta.get_field('tenant').column)} = %s "
               f"AND {quote(meta.get_field('agent_id').column)} = %s")  # type: ignore[arg-type]  # a concrete field
        if connection.features.has_select_for_update:
            sql += " FOR UPDATE"
        _LOCKED_SQL[connection.vendor] = sql
    rows = list(Agent.objects.raw(sql, [tenant, agent_id]))
    return rows[0] if rows else None


def _insert_new(agent: Agent) -> bool:
    """INSERT ``agent`` unless its id exists. True when inserted, with the new key set.

    PostgreSQL: ``ON CONFLICT DO NOTHING`` ((tenant, agent_id) is the one unique key besides
    the primary key, and only unique violations are ignored), one statement where a savepoint
    around a plain INSERT took three. SQLite: a plain INSERT (its ``OR IGNORE`` would hide any
    constraint failure); the transaction began IMMEDIATE, holding the database's write lock, so
    no other registration can have inserted the id the locked read just found absent."""
    meta = Agent._meta
    ignore = OnConflict.IGNORE if connection.vendor == "postgresql" else None
    rows = Agent.objects._insert(  # type: ignore[attr-defined]  # private QuerySet API
        [agent], fields=[f for f in meta.concrete_fields if not f.primary_key],
        returning_fields=[meta.pk], on_conflict=ignore,
    )
    if not rows or rows[0] is None:
        return False
    agent.pk = rows[0][0]
    agent._state.adding = False
    agent._state.db = Agent.objects.db
    return True


@dataclass(slots=True)
class Registration:
    """A registration checked as far as it can be without the database: its input validated,
    its scopes authorized, its card resolved and parsed, its URL checked
    (:func:`registration`). :func:`agent_register` writes one; :func:`agents_register` writes
    many in one transaction (group commit)."""

    actor: Actor
    agent_id: str  # the bare id, in ``tenant``
    parsed: ParsedCard
    fields: dict[str, Any]
    now: Any
    source: str
    node_id: str | None
    tenant: str = ""
    shared_with: list[str] | None = None  # tenant slugs; None: unchanged

    @property
    def key(self) -> str:
        return agent_key(self.tenant, self.agent_id)


def registration(
    *,
    actor: Actor,
    agent_id: Any,
    url: str | None = None,
    card: dict[str, Any] | bytes | None = None,
    ttl_seconds: Any = None,
    max_concurrency: Any = None,
    source: str = Agent.Source.API,
    node_id: str | None = None,
    strict: bool | None = None,
    credential_passthrough: bool | None = None,
    public: bool | None = None,
    visibility: str | None = None,
    shared_with: list[str] | None = None,
    push_relay: Any = UNSET,
) -> Registration:
    """Check a registration (``agent_register``'s arguments) before any database work;
    refusals raise as :func:`agent_register` raises them. ``agent_id``: a bare id (the
    caller's tenant) or a qualified one (``{tenant}.{agent_id}``, a platform admin's)."""
    tenant = actor.tenant
    error = agent_name_error(agent_id)
    if error:
        raise InvalidInput(error)
    if "." in agent_id:
        tenant, agent_id = actor.locate(agent_id)
    error = agent_id_error(agent_id)
    if error:
        raise InvalidInput(error)
    ttl = _check_ttl(ttl_seconds)
    concurrency = _check_concurrency(max_concurrency)
    _authorize_register(actor, agent_id, None, tenant)  # scopes: refused before any work
    visibility, shared_with = _check_visibility(visibility, shared_with)
    if credential_passthrough is not None:
        credential_passthrough = _check_passthrough(credential_passthrough)
    if push_relay is not UNSET:
        push_relay = _check_push_relay(push_relay)
    parsed = _resolve_card(url=url, card=card, strict=strict)
    now = timezone.now()
    fields = {
        "ttl_seconds": ttl,
        "max_concurrency": concurrency,
        "last_seen": now,
        "expires_at": now + timedelta(seconds=ttl),
        "status": Agent.Status.ACTIVE,
        "source": source,
        "routing_changed_at": now,
    }
    if credential_passthrough is not None:
        fields["credential_passthrough"] = credential_passthrough
    if push_relay is not UNSET:  # omitted on re-registration: kept
        fields["push_relay"] = push_relay
    if public is not None:  # omitted on re-registration: the ARD listing stays as it was
        fields["public"] = bool(public)
    if visibility is not None:  # omitted on re-registration: as it was (new: private)
        fields["visibility"] = visibility
    # Counted last: a registration refused for what it says uses none of the tenant's rate.
    check_registration_rate(tenant)
    return Registration(actor=actor, agent_id=agent_id, parsed=parsed, fields=fields, now=now,
                        source=source, node_id=node_id, tenant=tenant, shared_with=shared_with)


def _check_tenant(tenant: str) -> None:
    """A platform admin's registration into a tenant that does not exist: refused."""
    if not Tenant.objects.filter(slug=tenant).exists():
        raise InvalidInput(f"unknown tenant {tenant!r}")


def agent_register(**kwargs: Any) -> tuple[Agent, bool]:
    """Register or re-register an agent (:func:`registration`'s arguments). Returns
    ``(agent, created)``.

    Re-registration keeps ``registered_at`` and renews the lease; ``credential_passthrough``
    None keeps the agent's current choice (off for a new agent). Two concurrent registrations
    of one id leave exactly one row: the loser of the insert race updates the winner's row.
    """
    return register_one(registration(**kwargs))


def register_one(reg: Registration) -> tuple[Agent, bool]:
    """Write one checked registration in its own transaction."""
    with tracing.span("registry.register", **{"a2a.agent_id": reg.key}):
        return _register_one(reg)


def _register_one(reg: Registration) -> tuple[Agent, bool]:
    actor, agent_id, parsed = reg.actor, reg.agent_id, reg.parsed
    fields = dict(reg.fields)
    created = False
    # One locked read, then one write: the owner and quota checks see the row the write
    # replaces (a registration is a handful of statements).
    with transaction.atomic():
        agent = _locked(agent_id, reg.tenant)
        old_sha = agent.card_sha256 if agent is not None else None
        old_signature = agent.card_signature if agent is not None else None
        check_tenant_quotas(reg.tenant, card_bytes=len(parsed.raw), new_agent=agent is None)
        if agent is None:
            if reg.tenant != actor.tenant:
                _check_tenant(reg.tenant)
            check_agent_quota(actor)
            agent, created = _insert_or_find(reg, fields)
            if not created:  # a concurrent registration of the same id won the insert
                old_sha, old_signature = agent.card_sha256, agent.card_signature
        if not created:
            _authorize_register(actor, agent_id, agent, reg.tenant)
            fields["node_id"] = reg.node_id or _owning_node(agent_id=agent_id, current=agent)
            for key, value in fields.items():
                setattr(agent, key, value)
            _apply_card(agent, parsed)
            agent.save()
        _set_shared(agent, reg.shared_with)
        _record_card_version(agent, parsed, new_agent=created, unchanged=(
            old_sha == parsed.sha256 and old_signature == agent.card_signature))
        _announce(reg, agent, created, old_sha)
    return agent, created


def _new_agent(reg: Registration, fields: dict[str, Any]) -> Agent:
    """The row of a new agent (not yet inserted)."""
    fields["node_id"] = reg.node_id or _owning_node(agent_id=reg.agent_id, current=None)
    agent = Agent(agent_id=reg.agent_id, tenant_id=reg.tenant, registered_at=reg.now, **fields)
    if reg.actor.api_client_pk:
        agent.owner_id = reg.actor.api_client_pk
    _apply_card(agent, reg.parsed)
    return agent


def _insert_or_find(reg: Registration, fields: dict[str, Any]) -> tuple[Agent, bool]:
    """Insert the new agent, or the row a concurrent registration inserted first (locked).

    When that winner was deregistered again before this re-read, nothing is left to renew:
    the insert is tried once more. Losing twice in a row answers a retryable conflict (409),
    never a server error."""
    for _attempt in range(2):
        agent = _new_agent(reg, dict(fields))
        if _insert_new(agent):
            return agent, True
        winner = _locked(reg.agent_id, reg.tenant)
        if winner is not None:
            return winner, False
    raise RegistrationConflict(
        f"agent {reg.agent_id} was registered and deregistered concurrently; retry")


def _announce(reg: Registration, agent: Agent, created: bool, old_sha: str | None,
              batch: tuple[list, list] | None = None) -> None:
    """The registration's event and audit record, delivered after commit (collected into
    ``batch``, events and records, when given: the caller delivers them together)."""
    actor = reg.actor
    if agent.owner_id is not None and agent.owner_id == actor.api_client_pk:
        agent._owner_client_id = actor.client_id  # type: ignore[attr-defined]  # the answer names the owner: no read
    event = _event("registered" if created else "updated", agent, actor, committed=True)
    record = None
    if created or old_sha != reg.parsed.sha256:  # a plain renewal is not a change
        record = events.AuditRecord(
            action="agent.registered" if created else "agent.card_changed",
            actor=actor.client_id,
            agent_id=reg.key,
            tenant=reg.tenant,
            details={"url": agent.url, "card_sha256": reg.parsed.sha256, "source": reg.source},
        )
    if batch is not None:
        batch[0].append(event)
        if record is not None:
            batch[1].append(record)
        return
    events.publish(event)
    if record is not None:
        events.audit(record)


def agent_update(
    *,
    actor: Actor,
    agent_id: str,
    url: str | None = None,
    card: dict[str, Any] | bytes | None = None,
    ttl_seconds: Any = None,
    max_concurrency: Any = None,
    credential_passthrough: bool | None = None,
    public: bool | None = None,
    visibility: str | None = None,
    shared_with: list[str] | None = None,
    push_relay: Any = UNSET,
) -> Agent:
    """Partially update an agent (PATCH): a new card, URL, TTL, concurrency cap, credential
    passthrough, ARD listing or tenant visibility."""
    tenant, bare = _located(actor, agent_id)
    visibility, shared_with = _check_visibility(visibility, shared_with)
    with transaction.atomic():
        agent = Agent.objects.select_for_update().filter(tenant_id=tenant, agent_id=bare).first()
        if agent is None:
            raise AgentNotFound(agent_id)
        if not _owns(actor, agent) or not actor.has_scope(SCOPE_REGISTER):
            raise PermissionDenied(f"this client may not change {agent_id}")
        if ttl_seconds is not None:
            agent.ttl_seconds = _check_ttl(ttl_seconds)
            agent.expires_at = timezone.now() + timedelta(seconds=agent.ttl_seconds)
        if max_concurrency is not None:
            agent.max_concurrency = _check_concurrency(max_concurrency)
        if credential_passthrough is not None:
            agent.credential_passthrough = _check_passthrough(credential_passthrough)
        if public is not None:
            agent.public = bool(public)
        if visibility is not None:
            agent.visibility = visibility
        _set_shared(agent, shared_with)
        if push_relay is not UNSET:
            agent.push_relay = _check_push_relay(push_relay)
        if url is not None or card is not None:
            parsed = _resolve_card(
                url=url if url is not None else agent.url,
                card=card if card is not None else agent.card_raw.encode(),
                strict=None,
            )
            check_tenant_quotas(tenant, card_bytes=len(parsed.raw), new_agent=False)
            _apply_card(agent, parsed)
            _record_card_version(agent, parsed)
        agent.routing_changed_at = timezone.now()
        agent.save()
        _publish("updated", agent)
        events.audit(
            events.AuditRecord(
                action="agent.updated",
                actor=actor.client_id,
                agent_id=agent.key,
                tenant=str(agent.tenant_id),
                details={
                    "ttl_seconds": ttl_seconds,
                    "max_concurrency": max_concurrency,
                    "card_sha256": agent.card_sha256,
                },
            )
        )
    return agent


@tracing.traced("registry.deregister")
def agent_deregister(*, actor: Actor, agent_id: str) -> None:
    """Remove an agent and its card history; its subscriber is torn down by the event."""
    tenant, bare = _located(actor, agent_id)
    key = agent_key(tenant, bare)
    with transaction.atomic():
        agent = Agent.objects.select_for_update().filter(tenant_id=tenant, agent_id=bare).first()
        if agent is None:
            raise AgentNotFound(agent_id)
        if not _owns(actor, agent) or not actor.has_scope(SCOPE_REGISTER):
            raise PermissionDenied(f"this client may not deregister {agent_id}")
        agent.delete()
        # A node that misses the event still sees the deletion at its next incremental resync.
        AgentTombstone.objects.create(tenant_id=tenant, agent_id=bare)
        events.publish(events.AgentEvent(kind="deregistered", agent_id=key))
        events.audit(
            events.AuditRecord(
                action="agent.deregistered", actor=actor.client_id, agent_id=key, tenant=tenant
            )
        )


def agents_register(regs: list[Registration]) -> list[tuple[Agent, bool] | Exception]:
    """Write checked registrations arriving together (group commit): each item's
    ``(agent, created)`` or the refusal it alone gets, in order.

    PostgreSQL: the new agents and their first card versions in one statement (a
    data-modifying CTE: ``INSERT ... ON CONFLICT DO NOTHING`` and the versions of the rows it
    inserted; in autocommit its commit travels with it: one round trip a batch), then the
    events go out together. What the batch does not settle -- a re-registration, an id twice
    in the batch, an id another node inserted meanwhile, a client near its agent quota -- is
    written afterwards by :func:`register_one`, as is everything when the batch statement
    fails. SQLite: the items one by one, each in its savepoint, under one transaction (its
    commit is the cost)."""
    if connection.vendor != "postgresql":
        return _register_in_one_transaction(regs)
    results: list[Any] = [None] * len(regs)
    try:
        with tracing.span("registry.register_batch", **{"a2a.batch_size": len(regs)}):
            later = _register_new_together(regs, results)
    except Exception as exc:
        if outage.is_database_outage(exc) and not _rolled_back(exc):
            raise
        results, later = [None] * len(regs), list(range(len(regs)))
    for index in sorted(later):
        results[index] = _refusal_or(register_one, regs[index])
    return results


def _rolled_back(exc: BaseException) -> bool:
    """A deadlock or serialization failure (SQLSTATE class 40): the database rolled the batch
    back and is fine -- its items are retried one by one, not answered as an outage."""
    cause = exc.__cause__ or exc
    return str(getattr(cause, "sqlstate", "") or "").startswith("40")


def _register_in_one_transaction(regs: list[Registration]) -> list[Any]:
    with transaction.atomic():
        return [_refusal_or(register_one, reg) for reg in regs]


def _refusal_or(fn, reg: Registration) -> Any:
    """``fn(reg)``, or the exception it raised (a database outage is raised: it fails all)."""
    try:
        return fn(reg)
    except Exception as exc:
        if outage.is_database_outage(exc):
            raise
        return exc


def _register_new_together(regs: list[Registration], results: list[Any]) -> list[int]:
    """Insert the batch's new agents with their first card versions in one statement,
    filling ``results``; the indexes of the items left for :func:`register_one` (which reads
    and locks the row: re-registrations, quota decisions)."""
    later: list[int] = []
    first: dict[str, int] = {}
    limited = tenants_limited({reg.tenant for reg in regs})
    for index, reg in enumerate(regs):
        if reg.agent_id in first or reg.shared_with is not None or \
                reg.tenant != reg.actor.tenant or reg.tenant in limited:
            # The same id twice (the second renews the first's row, or is another tenant's:
            # the statement below matches versions by bare id), a share list to write, a
            # platform admin's registration into another tenant (checked) or a tenant with
            # quotas of its own: one by one.
            later.append(index)
        else:
            first[reg.agent_id] = index
    rooms: dict[Any, int | None] = {}
    new: list[tuple[int, Agent]] = []
    for agent_id in sorted(first):  # one insertion order for every node's batches
        index, reg = first[agent_id], regs[first[agent_id]]
        try:
            take_agent_quota(reg.actor, rooms)
        except PermissionDenied:
            later.append(index)  # near the quota: decided on its own, with the row read
            continue
        with tracing.span("registry.register", **{"a2a.agent_id": agent_id}):
            new.append((index, _new_agent(reg, dict(reg.fields))))
    inserted = _insert_with_versions([(agent, regs[index].parsed) for index, agent in new])
    announced: tuple[list, list] = ([], [])  # events, audit records
    for index, agent in new:
        if agent.agent_id not in inserted:
            later.append(index)  # registered already (or by another node meanwhile)
            continue
        results[index] = (agent, True)
        _announce(regs[index], agent, True, None, batch=announced)
    events.publish_many(announced[0])
    for record in announced[1]:
        events.audit(record)
    return later


def _insert_with_versions(cards: list[tuple[Agent, ParsedCard]]) -> set[str]:
    """INSERT the agents (skipping ids that exist) and the first card version of each one
    inserted, in one statement; the ids inserted, their keys set."""
    if not cards:
        return set()
    agent_fields = [f for f in Agent._meta.concrete_fields if not f.primary_key]
    agent_rows, agent_params = rows.unnest(agent_fields, [agent for agent, _ in cards])
    version_meta = CardVersion._meta
    fk = version_meta.get_field("agent")
    version_fields = [f for f in version_meta.concrete_fields if not f.primary_key and f != fk]
    versions = [CardVersion(sha256=parsed.sha256, **_version_fields(agent, parsed))
                for agent, parsed in cards]
    version_rows, version_params = rows.unnest(
        version_fields, versions, first=[agent.agent_id for agent, _ in cards])
    quote = connection.ops.quote_name
    key, agent_id = quote(Agent._meta.pk.column), quote(Agent._meta.get_field("agent_id").column)  # type: ignore[arg-type]  # concrete fields
    columns = ", ".join(f"v.c{i}" for i in range(len(version_fields)))
    names = ", ".join(f"c{i}" for i in range(len(version_fields)))
    sql = (f"WITH a AS ({rows.insert_into(Agent, agent_fields)} SELECT * FROM {agent_rows} "
           f"ON CONFLICT DO NOTHING RETURNING {key}, {agent_id}), "
           f"v AS ({rows.insert_into(CardVersion, [fk, *version_fields])} "
           f"SELECT a.{key}, {columns} FROM a JOIN {version_rows} AS v(k, {names}) "
           f"ON v.k = a.{agent_id}) "
           f"SELECT {key}, {agent_id} FROM a")
    if connection.in_atomic_block:  # a caller's transaction: a failure here must not break it
        with transaction.atomic():
            written = rows.execute(sql, agent_params + version_params, fetch=True)
    else:  # autocommit (the node's batches): the statement is its own transaction
        written = rows.execute(sql, agent_params + version_params, fetch=True)
    keys = {agent_id: pk for pk, agent_id in written}
    for agent, _ in cards:
        if agent.agent_id in keys:
            agent.pk = keys[agent.agent_id]
            agent._state.adding = False
            agent._state.db = Agent.objects.db
    return set(keys)
