"""The discovery control loop: one cycle runs sources -> resolver -> card cache -> health ->
matcher -> cap -> registry upsert -> snapshot, in the background. The request path only ever
reads the published snapshot.

One cycle serves every tenant with discovery rows (docs/tenants.md), one after the other: each
tenant's sources and needs, its agents upserted into it, its own snapshot. The allowlist, the
policy, the card cache and endpoint health are the platform's, shared by every tenant.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from django.conf import settings
from redis.exceptions import LockError

from core import tracing
from core.locks import RedisLocks, default_locks
from discovery import alerts, metrics
from discovery.card_cache import CardCache, Outcome, RefreshResult, default_cache
from discovery.card_store import CardEntry
from discovery.config_file import ConfigFileError, config_file_sync
from discovery.health import DEGRADED, degraded_urls, health_observe_many
from discovery.matcher import EXACT, matched_needs, needs_active, policy_hook, text_matches
from discovery.models import Alert, ConfiguredAgent, CycleRun, DiscoveryPolicy, SourceFeed
from discovery.resolver import Admission, allowlist_entries, resolve
from discovery.sessions import sessions_expire
from discovery.snapshots import (
    SelectedAgent,
    select_capped,
    snapshot_agent_ids_retained,
    snapshot_publish,
    snapshots_evict,
    snapshots_retained,
)
from discovery.sources import EndpointRecord, collect_records
from registry import services as registry_services
from registry import signatures
from registry.cards import card_endpoint
from registry.ids import DEFAULT_TENANT, agent_key
from registry.models import Agent, CardVersion
from registry.permissions import SYSTEM

logger = logging.getLogger(__name__)

Progress = Callable[[int], None]

#: How a cycle's summary begins the lines the console reads back (discovery.admin): the
#: configuration file could not be read, a source failed, a card fetch failed; and the first
#: line of a cycle with nothing to do or one skipped.
CONFIG_ERROR_LINE = "config file error: "
SOURCE_ERROR_LINE = "source error: "
FETCH_ERROR_LINE = "fetch error: "
NOT_CONFIGURED = "discovery is not configured (no DISCOVERY_CONFIG, no source rows): idle"
SKIPPED = "another discovery cycle is running: skipped"
#: Before each tenant's section of a cycle that served another tenant than the default only.
TENANT_LINE = "tenant: "


@dataclass
class CycleReport:
    """What one cycle did; ``summary()`` is what ``discover --once`` prints."""

    tenant: str = DEFAULT_TENANT
    configured: bool = True
    skipped: bool = False
    config_error: str | None = None
    source_errors: list[str] = field(default_factory=list)
    proposed: int = 0
    admitted: int = 0
    refused: int = 0
    duplicates: int = 0
    collisions: int = 0
    outcomes: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    degraded: int = 0
    newly_degraded: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    candidates: int = 0
    selected: int = 0
    capped: int = 0
    published: bool = False
    version: int | None = None
    digest: str | None = None
    seconds: float = 0.0
    #: The other tenants' reports of the same cycle (this one is the default tenant's when it
    #: had discovery rows, else the first tenant's).
    others: list[CycleReport] = field(default_factory=list)

    @property
    def fetched(self) -> int:
        return self.outcomes[Outcome.FETCHED] + self.outcomes[Outcome.UNCHANGED]

    @property
    def not_modified(self) -> int:
        return self.outcomes[Outcome.NOT_MODIFIED]

    @property
    def failed(self) -> int:
        return self.outcomes[Outcome.FAILED]

    @property
    def tenants(self) -> list[CycleReport]:
        """Every tenant's report of the cycle, this one first."""
        return [self, *self.others]

    def summary(self) -> str:
        """What ``discover --once`` prints: the default tenant's lines when it is the only
        tenant served, else a section per tenant, each under a ``tenant: <slug>`` line."""
        if not self.configured:
            return NOT_CONFIGURED
        if self.skipped:
            return SKIPPED
        if self.others or self.tenant != DEFAULT_TENANT:
            lines = [f"{CONFIG_ERROR_LINE}{self.config_error}"] if self.config_error else []
            for report in self.tenants:
                lines += [f"{TENANT_LINE}{report.tenant}", *report._lines()]
        else:
            lines = [f"{CONFIG_ERROR_LINE}{self.config_error}"] if self.config_error else []
            lines += self._lines()
        lines.append(f"took {self.seconds:.2f}s")
        return "\n".join(lines)

    def _lines(self) -> list[str]:
        lines = [
            f"endpoints: {self.proposed} proposed, {self.admitted} admitted, "
            f"{self.refused} refused, {self.duplicates} duplicates, {self.collisions} collisions",
            f"cards: {self.fetched} fetched (200), {self.not_modified} not modified (304), "
            f"{self.failed} failed, {self.outcomes[Outcome.FRESH]} fresh in cache",
            f"health: {self.degraded} degraded"
            + (f" (newly: {', '.join(self.newly_degraded)})" if self.newly_degraded else "")
            + (f", recovered: {', '.join(self.recovered)}" if self.recovered else ""),
            f"selected: {self.selected} of {self.candidates} candidates"
            + (f" ({self.capped} left out by the cap)" if self.capped else ""),
            (f"snapshot published: v{self.version} {self.digest}" if self.published
             else f"snapshot unchanged: v{self.version} {self.digest}" if self.version
             else "no snapshot"),
        ]
        lines += [f"{SOURCE_ERROR_LINE}{e}" for e in self.source_errors]
        lines += [f"{FETCH_ERROR_LINE}{e}" for e in self.errors[:20]]
        return lines


def cycle_health(run: CycleRun) -> tuple[str, str, str]:
    """A cycle's health badge: (css class, label, title), read from its summary's lines."""
    lines = run.summary.splitlines()
    if lines[:1] == [NOT_CONFIGURED]:
        return "expired", "idle", "discovery is not configured"
    if lines[:1] == [SKIPPED]:
        return "expired", "skipped", "another discovery cycle was running"
    config = [line for line in lines if line.startswith(CONFIG_ERROR_LINE)]
    if config:
        return "dead", "config error", config[0]
    sources = [line for line in lines if line.startswith(SOURCE_ERROR_LINE)]
    if sources:
        return "dead", f"{len(sources)} source error(s)", "; ".join(sources)
    if run.failed:
        return "expiring", f"{run.failed} card(s) failed", "see the summary's fetch errors"
    return "active", "ok", "every source and card answered"


def discovery_is_configured() -> bool:
    """A configuration file is named, or source rows exist (cheap: two EXISTS queries)."""
    return bool(settings.DISCOVERY_CONFIG) or ConfiguredAgent.objects.exists() \
        or SourceFeed.objects.exists()


def discovery_tenants() -> list[str]:
    """The tenants a cycle serves: those with configured agents or source feeds, and the
    default tenant when a configuration file is named (its entries are the default tenant's);
    the default first, then by slug."""
    found = set(ConfiguredAgent.objects.order_by().values_list("tenant_id", flat=True).distinct())
    found |= set(SourceFeed.objects.order_by().values_list("tenant_id", flat=True).distinct())
    if settings.DISCOVERY_CONFIG:
        found.add(DEFAULT_TENANT)
    return sorted(found, key=lambda t: (t != DEFAULT_TENANT, t))


_local_cycle = threading.Lock()


@contextmanager
def _cycle_guard() -> Iterator[bool]:
    """One cycle at a time: in this process, and across workers through Redis."""
    if not _local_cycle.acquire(blocking=False):
        yield False
        return
    locks = default_locks()
    try:
        if isinstance(locks, RedisLocks):
            ttl = max(60.0, settings.DISCOVERY_INTERVAL_SECONDS * 5)
            lock = locks.hold("cycle", ttl=ttl)
            if lock is None:
                yield False
                return
            try:
                yield True
            finally:
                try:
                    lock.release()
                except LockError:  # it expired (a cycle longer than its TTL) and may be another's
                    logger.warning("discovery cycle outlived its lock (%.0f s)", ttl)
        else:
            yield True
    finally:
        _local_cycle.release()


def _inline_entry(record: EndpointRecord) -> CardEntry | None:
    try:
        card = orjson.loads(record.inline_card or b"")
    except orjson.JSONDecodeError:
        return None
    return CardEntry(
        card_url=record.card_url, sha256=record.inline_sha256 or "", card=card,
        raw=record.inline_card,
    )


def _alert_changes(results: dict[str, RefreshResult], names: dict[str, str], report: CycleReport,
                   degrade_after: int, critical: dict[str, bool]) -> None:
    for url, result in results.items():
        if result.changed:
            alerts.alerts_for_card_change(
                local_name=names[url], card_url=url, old_card=result.previous.card,  # type: ignore[union-attr]  # changed: set
                new_card=result.entry.card,  # type: ignore[union-attr]  # changed: set
            )
        if result.outcome == Outcome.FAILED:
            entry = result.entry
            if entry is None or not entry.has_card:
                report.errors.append(f"{names[url]}: {result.error}")
            if entry is not None and entry.failures == degrade_after:
                alerts.alert_raise(
                    kind=Alert.Kind.FETCH_FAILURES, subject=url, dedupe=False,
                    message=f"{names[url]}: {entry.failures} consecutive card fetch failures "
                            f"({result.error})",
                    details={"local_name": names[url], "failures": entry.failures,
                             "error": result.error, "critical": critical[url],
                             "serving_stale": entry.has_card},
                )


@dataclass(frozen=True)
class _Signed:
    """The card a candidate goes forward with, and whether its signature is valid."""

    card: dict[str, Any]
    raw: bytes | None
    sha256: str
    valid: bool


def _last_valid_versions(agent_ids: list[str], tenant: str) -> dict[str, CardVersion]:
    """The newest card version with a valid signature of each of ``tenant``'s agents (one query
    per 500)."""
    out: dict[str, CardVersion] = {}
    for i in range(0, len(agent_ids), 500):
        rows = (CardVersion.objects.filter(agent__tenant_id=tenant,
                                           agent__agent_id__in=agent_ids[i:i + 500],
                                           signature_status=signatures.VALID)
                .select_related("agent").only("agent__agent_id", "sha256", "card_raw")
                .order_by("agent__agent_id", "-created_at", "-id"))
        for row in rows:
            out.setdefault(row.agent.agent_id, row)
    return out


def _signature_gate(entries: dict[int, tuple[EndpointRecord, CardEntry]], tenant: str
                    ) -> dict[int, _Signed]:
    """Apply ``A2A_CARD_SIGNATURES`` to the cycle's cards (docs/signatures.md).

    A card whose signature is not valid while the agent has an earlier valid version keeps
    that version (and raises an alert): a card that turns invalid on refresh never replaces a
    signed one. Under ``require`` a card with no valid version is left out; under ``verify`` it
    goes on, unsigned, and only needs with ``require_signed`` pass it by.
    """
    mode = signatures.policy()
    out: dict[int, _Signed] = {}
    if mode == "off":
        return out
    verdicts = {
        key: signatures.verify_card(entry.card or {}, sha256=entry.sha256)
        for key, (_, entry) in entries.items()
    }
    failing = sorted({entries[k][0].target_agent_id for k, v in verdicts.items() if not v.valid})
    last_valid = _last_valid_versions(failing, tenant) if failing else {}
    for key, (record, entry) in entries.items():
        verdict = verdicts[key]
        if verdict.valid:
            out[key] = _Signed(entry.card or {}, entry.raw, entry.sha256, True)
            continue
        kept = last_valid.get(record.target_agent_id)
        if kept is not None and not signatures.verify_card(kept.card, sha256=kept.sha256).valid:
            kept = None  # signed by a key that has since been retired
        if kept is not None or mode == "require" or verdict.status != signatures.UNSIGNED:
            alerts.alert_signature(
                local_name=record.local_name, card_url=record.card_url or record.base_url,
                status=verdict.status, detail=verdict.detail, sha256=entry.sha256,
                kept_sha256=kept.sha256 if kept is not None else None, tenant=tenant,
            )
        if kept is not None:
            out[key] = _Signed(kept.card, kept.card_raw.encode(), kept.sha256, True)
        elif mode != "require":
            out[key] = _Signed(entry.card or {}, entry.raw, entry.sha256, False)
    return out


def _upsert_agents(kept: list[SelectedAgent], ttl: int, tenant: str) -> list[SelectedAgent]:
    """Make the selected agents routable: upsert discovered ones into ``tenant``'s registry
    (routing key ``tenant.agent_id``). An id held by an agent from another source is a
    collision: that agent is left out."""
    derived = [a for a in kept if a.source != "registry"]
    rows = {
        a.agent_id: a
        for a in Agent.objects.filter(tenant_id=tenant,
                                      agent_id__in=[s.agent_id for s in derived])
        .only("agent_id", "source", "card_sha256", "status", "expires_at", "url")
    }
    out = [a for a in kept if a.source == "registry"]
    for agent in derived:
        row = rows.get(agent.agent_id)
        if row is not None and row.source != Agent.Source.DISCOVERY:
            alerts.alert_raise(
                kind=Alert.Kind.NAME_COLLISION, subject=agent_key(tenant, agent.agent_id),
                message=f"{agent.local_name}: agent id {agent_key(tenant, agent.agent_id)} is "
                        f"registered by "
                        f"another source ({row.source}); left out",
                details={"local_name": agent.local_name, "card_url": agent.card_url},
                tenant=tenant,
            )
            continue
        endpoint = card_endpoint(agent.card or {})
        if row is None or not row.is_routable or row.card_sha256 != agent.card_sha256 \
                or row.url != endpoint:
            try:
                registry_services.agent_register(
                    actor=SYSTEM, agent_id=agent_key(tenant, agent.agent_id), url=endpoint,
                    card=agent.raw,
                    ttl_seconds=ttl, source=Agent.Source.DISCOVERY,
                )
            except registry_services.RegistryError as exc:
                alerts.alert_raise(
                    kind=Alert.Kind.REFUSED, subject=agent.card_url,
                    message=f"{agent.local_name}: the registry refused it: {exc}",
                    details={"local_name": agent.local_name, "error": str(exc)},
                    tenant=tenant,
                )
                continue
        out.append(agent)
    return out


def _keep_routable(ttl: int, tenant: str) -> None:
    """Renew leases of ``tenant``'s discovered agents its retained snapshots reference;
    re-register those whose lease lapsed (from the card bytes the snapshot retained)."""
    from discovery.models import CardBlob

    ids = snapshot_agent_ids_retained(tenant)
    registry_services.agents_renew_leases(
        agent_ids=list(ids), ttl_seconds=ttl, source=Agent.Source.DISCOVERY, tenant=tenant
    )
    routable = set(Agent.objects.routable()
                   .filter(tenant_id=tenant, agent_id__in=list(ids))
                   .values_list("agent_id", flat=True))
    lapsed = {
        row["agent_id"]: row for snap in snapshots_retained(tenant) for row in snap.agents
        if row["agent_id"] not in routable and row.get("source") != "registry"
    }
    if not lapsed:
        return
    taken = set(Agent.objects.filter(tenant_id=tenant, agent_id__in=list(lapsed))
                .exclude(source=Agent.Source.DISCOVERY).values_list("agent_id", flat=True))
    blobs = {b.sha256: b for b in CardBlob.objects.filter(
        sha256__in=[r["card_sha256"] for r in lapsed.values()])}
    for agent_id, row in lapsed.items():
        blob = blobs.get(row["card_sha256"])
        if blob is None or agent_id in taken:
            continue
        try:
            registry_services.agent_register(
                actor=SYSTEM, agent_id=agent_key(tenant, agent_id), url=card_endpoint(blob.card),
                card=bytes(blob.raw),
                ttl_seconds=ttl, source=Agent.Source.DISCOVERY,
            )
        except registry_services.RegistryError as exc:
            logger.warning("could not keep %s routable: %s", agent_id, exc)


@tracing.traced("discovery.cycle")
def run_cycle(
    *,
    cache: CardCache | None = None,
    progress: Progress | None = None,
    on_total: Callable[[int], None] | None = None,
) -> CycleReport:
    """Run one full discovery cycle and report what it did."""
    started = time.monotonic()
    report = CycleReport()
    if settings.DISCOVERY_CONFIG:
        try:
            config_file_sync()
        except ConfigFileError as exc:
            report.config_error = str(exc)
            logger.error("discovery configuration file: %s", exc)
    if not discovery_is_configured():
        report.configured = False
        return report
    with _cycle_guard() as mine:
        if not mine:
            report.skipped = True
            return report
        for i, tenant in enumerate(discovery_tenants()):
            mine_report = report if i == 0 else CycleReport(tenant=tenant)
            mine_report.tenant = tenant
            if i:
                report.others.append(mine_report)
            _cycle(mine_report, cache or default_cache(), progress, on_total, tenant)
        sessions_expire()
        snapshots_evict()
    report.seconds = time.monotonic() - started
    metrics.CYCLE_SECONDS.observe(report.seconds)
    _record_cycle(report)
    tracing.annotate(**{"discovery.cards_fetched": report.fetched,
                        "discovery.cards_failed": report.failed,
                        "discovery.selected": report.selected,
                        "discovery.snapshot_version": report.version})
    return report


def _record_cycle(report: CycleReport) -> None:
    """Keep the cycle's summary for the operator console (the last CycleRun.KEEP)."""
    from datetime import timedelta

    from django.utils import timezone

    every = report.tenants
    CycleRun.objects.create(
        started_at=timezone.now() - timedelta(seconds=report.seconds), seconds=report.seconds,
        fetched=sum(r.fetched for r in every), not_modified=sum(r.not_modified for r in every),
        failed=sum(r.failed for r in every), selected=sum(r.selected for r in every),
        published=any(r.published for r in every), version=report.version,
        digest=report.digest or "", summary=report.summary(),
    )
    stale = CycleRun.objects.order_by("-started_at", "-id").values_list("pk", flat=True)[
        CycleRun.KEEP:CycleRun.KEEP + 100]
    if stale:
        CycleRun.objects.filter(pk__in=list(stale)).delete()


def _cycle(report: CycleReport, cache: CardCache, progress: Progress | None,
           on_total: Callable[[int], None] | None, tenant: str) -> None:
    """One tenant's part of a cycle."""
    policy, _ = DiscoveryPolicy.objects.get_or_create(pk=1)
    records, report.source_errors = collect_records(tenant)
    report.proposed = len(records)
    admission = Admission(allowlist_entries())
    resolved = resolve(records, admission=admission)
    report.admitted, report.refused = len(resolved.admitted), len(resolved.refused)
    report.duplicates, report.collisions = resolved.duplicates, len(resolved.collisions)
    for record, reason in resolved.refused:
        alerts.alert_raise(
            kind=Alert.Kind.REFUSED, subject=record.base_url,
            message=f"{record.local_name} ({record.source}): {reason}",
            details={"local_name": record.local_name, "source": record.source, "reason": reason},
            tenant=tenant,
        )
    for record, other in resolved.collisions:
        alerts.alert_raise(
            kind=Alert.Kind.NAME_COLLISION, subject=record.base_url,
            message=f"{record.local_name} ({record.source}, {record.base_url}) collides with "
                    f"{other.local_name} ({other.source}, {other.base_url}); refused",
            details={"local_name": record.local_name, "kept": other.base_url}, tenant=tenant,
        )

    fetchable = [r for r in resolved.admitted if r.inline_card is None]
    names = {r.card_url: r.local_name for r in fetchable}
    critical = {r.card_url: r.critical for r in fetchable}
    if on_total:
        on_total(len(fetchable))
    results = cache.refresh_many(names, admit=admission.admits, progress=progress)
    report.outcomes.update(r.outcome for r in results.values())

    transitions = health_observe_many(
        observations={u: r.ok for u, r in results.items() if r.attempted},
        degrade_after=policy.degrade_after, recover_after=policy.recover_after,
    )
    for t in transitions:
        bucket = report.newly_degraded if t.after == DEGRADED else report.recovered
        bucket.append(names[t.card_url])
    _alert_changes(results, names, report, policy.degrade_after, critical)
    degraded = degraded_urls()
    # A degraded endpoint is revalidated every cycle so M successes take M cycles, not M
    # cache lifetimes; backoff still spaces out its failures.
    recovering = [u for u, r in results.items() if u in degraded and r.ok]
    if recovering:
        cache.mark_due(recovering)
    report.degraded = len(degraded & set(names))
    metrics.DEGRADED_ENDPOINTS.set(len(degraded))  # health is shared: every tenant's

    needs = needs_active(tenant)
    hook = policy_hook()
    candidates: list[SelectedAgent] = []
    usable: dict[int, tuple[EndpointRecord, CardEntry]] = {}
    for i, record in enumerate(resolved.admitted):
        entry = _inline_entry(record) if record.inline_card is not None else \
            (results[record.card_url].entry if record.card_url in results else None)
        if entry is None or not entry.has_card or record.card_url in degraded:
            continue
        usable[i] = (record, entry)
    gated = _signature_gate(usable, tenant)
    gate_on = signatures.policy() != "off"
    cards: dict[int, tuple[EndpointRecord, CardEntry, bool]] = {}
    for i, (record, entry) in usable.items():
        signed = gated.get(i)
        if gate_on and signed is None:
            continue  # require: no valid signature (alerted)
        if signed is not None and signed.sha256 != entry.sha256:
            entry = replace(entry, card=signed.card, raw=signed.raw, sha256=signed.sha256)
        cards[i] = (record, entry, signed is not None and signed.valid)
    # Needs given as text rank the cycle's cards together (scores are relative to the best).
    by_text = text_matches(
        {str(i): e.card for i, (r, e, _) in cards.items()  # type: ignore[misc]  # has_card
         if not (r.configured and r.source == ConfiguredAgent.Kind.STATIC)},
        needs, signed={str(i) for i, (_, _, valid) in cards.items() if valid},
    )
    for i, (record, entry, valid) in cards.items():
        card: dict[str, Any] = entry.card  # type: ignore[assignment]  # has_card checked above
        score = EXACT
        if record.configured and record.source == ConfiguredAgent.Kind.STATIC:
            description = record.description
        else:
            matched = matched_needs(card, needs, record=record, hook=hook, signed=valid,
                                    text_scores=by_text.get(str(i)))
            if not matched:
                continue
            (best, score) = matched[0]
            description = record.description if record.configured and record.description \
                else best.description
        endpoint = card_endpoint(card)
        reason = admission.refusal(endpoint) if endpoint else "the card has no endpoint"  # type: ignore[assignment]  # None: admitted
        if reason and record.inline_card is None:
            alerts.alert_raise(
                kind=Alert.Kind.REFUSED, subject=record.card_url,
                message=f"{record.local_name}: card endpoint {endpoint}: {reason}",
                details={"local_name": record.local_name, "endpoint": endpoint, "reason": reason},
                tenant=tenant,
            )
            continue
        candidates.append(SelectedAgent(
            local_name=record.local_name, description=description,
            agent_id=record.target_agent_id, card_sha256=entry.sha256, card_url=record.card_url,
            source=record.source, critical=record.critical, score=score, card=card,
            raw=entry.raw,
        ))
    report.candidates = len(candidates)
    kept, left_out = select_capped(candidates, max_agents=policy.max_agents)
    report.capped = len(left_out)
    if left_out:
        alerts.alert_raise(
            kind=Alert.Kind.CAP_REACHED, subject="snapshot",
            message=f"the cap of {policy.max_agents} agents left out "
                    f"{', '.join(a.local_name for a in left_out[:20])}"
                    + (" ..." if len(left_out) > 20 else ""),
            details={"max_agents": policy.max_agents,
                     "left_out": sorted(a.local_name for a in left_out)},
            tenant=tenant,
        )
    ttl = settings.DISCOVERY_AGENT_TTL_SECONDS
    kept = _upsert_agents(kept, ttl, tenant)
    report.selected = len(kept)
    snapshot, report.published = snapshot_publish(agents=kept, tenant=tenant)
    report.version, report.digest = snapshot.version, snapshot.digest
    _keep_routable(ttl, tenant)
