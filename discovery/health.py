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
        if current.state == HEALTHY:
            # Successes only count towards recovery: a steady healthy endpoint stays the same
            # row, with nothing to write.
            return HealthState(HEALTHY, 0, 0)
        successes = current.success_streak + 1
        if successes >= recover_after:
            return HealthState(HEALTHY, 0, 0)
        return HealthState(DEGRADED, 0, successes)
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
    rows: dict[str, HealthState] = {}
    for i in range(0, len(urls), 500):
        for url, *state in EndpointHealth.objects.filter(card_url__in=urls[i:i + 500]) \
                .values_list("card_url", "state", "failure_streak", "success_streak"):
            rows[url] = HealthState(*state)  # type: ignore[arg-type]  # the fields, in order
    now = timezone.now()
    changed: dict[tuple, list[str]] = {}
    created, transitions = [], []
    for url, ok in observations.items():
        row = rows.get(url)
        before = row or HealthState()
        after = observe(before, ok=ok, degrade_after=degrade_after, recover_after=recover_after)
        if after.state != before.state:
            transitions.append(Transition(url, before.state, after.state, after))
        if row is None:
            created.append(EndpointHealth(
                card_url=url, state=after.state, failure_streak=after.failure_streak,
                success_streak=after.success_streak, changed_at=now,
            ))
        elif after != before:
            changed.setdefault((after, after.state != before.state), []).append(url)
    EndpointHealth.objects.bulk_create(created, batch_size=500, ignore_conflicts=True)
    # Few distinct new states per cycle: one UPDATE per state, not one per row.
    for (after, moved), group in changed.items():
        values = {"state": after.state, "failure_streak": after.failure_streak,
                  "success_streak": after.success_streak}
        if moved:
            values["changed_at"] = now
        for i in range(0, len(group), 500):
            EndpointHealth.objects.filter(card_url__in=group[i:i + 500]).update(**values)
    return transitions


def degraded_urls() -> set[str]:
    return set(EndpointHealth.objects.filter(state=DEGRADED).values_list("card_url", flat=True))
