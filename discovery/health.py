"""Endpoint health with hysteresis: the loop's decision, not the cache's.

An endpoint becomes degraded after N consecutive failed fetches (default 3) and is left out of
the next snapshot; it comes back only after M consecutive successes (default 2), so a flapping
peer does not churn snapshots. Requests served from the cache (not due) are not observations.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils import timezone

from discovery.models import EndpointHealth

HEALTHY = EndpointHealth.State.HEALTHY
DEGRADED = EndpointHealth.State.DEGRADED


@dataclass(frozen=True)
class HealthState:
    state: str = HEALTHY
    failure_streak: int = 0
    success_streak: int = 0


def observe(current: HealthState, *, ok: bool, degrade_after: int, recover_after: int
            ) -> HealthState:
    """The state after one more observation."""
    if ok:
        # Capped: a steady healthy endpoint then stays the same row, with nothing to write.
        successes = min(current.success_streak + 1, recover_after)
        state = current.state
        if state == DEGRADED and successes >= recover_after:
            state = HEALTHY
        return HealthState(state, 0, successes)
    failures = current.failure_streak + 1
    state = DEGRADED if failures >= degrade_after else current.state
    return HealthState(state, failures, 0)


@dataclass(frozen=True)
class Transition:
    card_url: str
    before: str
    after: str
    state: HealthState


def health_observe_many(
    *, observations: dict[str, bool], degrade_after: int, recover_after: int
) -> list[Transition]:
    """Record one observation per card URL; return the state changes (healthy <-> degraded)."""
    if not observations:
        return []
    urls = list(observations)
    rows = {}
    for i in range(0, len(urls), 500):
        rows.update({r.card_url: r for r in EndpointHealth.objects.filter(
            card_url__in=urls[i:i + 500])})
    now = timezone.now()
    changed, created, transitions = [], [], []
    for url, ok in observations.items():
        row = rows.get(url)
        before = HealthState(row.state, row.failure_streak, row.success_streak) if row \
            else HealthState()
        after = observe(before, ok=ok, degrade_after=degrade_after, recover_after=recover_after)
        if after.state != before.state:
            transitions.append(Transition(url, before.state, after.state, after))
        if row is None:
            created.append(EndpointHealth(
                card_url=url, state=after.state, failure_streak=after.failure_streak,
                success_streak=after.success_streak, changed_at=now,
            ))
        elif after != before:
            row.state, row.failure_streak, row.success_streak = (
                after.state, after.failure_streak, after.success_streak)
            if after.state != before.state:
                row.changed_at = now
            changed.append(row)
    EndpointHealth.objects.bulk_create(created, batch_size=500, ignore_conflicts=True)
    if changed:
        EndpointHealth.objects.bulk_update(
            changed, ["state", "failure_streak", "success_streak", "changed_at"], batch_size=500
        )
    return transitions


def degraded_urls() -> set[str]:
    return set(EndpointHealth.objects.filter(state=DEGRADED).values_list("card_url", flat=True))
