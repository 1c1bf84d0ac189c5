"""The insert race of two registrations of one new id, forced deterministically: the second
registration's locked read finds no row (the first's INSERT is not committed yet), its
``INSERT ... ON CONFLICT DO NOTHING`` waits for the first transaction, inserts nothing once it
commits, and the registration renews the winner's row instead: one row, the loser's card
recorded as a new version, its answer "not created". PostgreSQL only: on SQLite the locked
read's transaction (BEGIN IMMEDIATE) already holds the database's write lock, so the race
cannot happen there."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction

from registry import services
from registry.models import Agent, CardVersion
from registry.permissions import PermissionDenied
from tests.conftest import make_client
from tests.registry.cards import card_03
from tests.services_helpers import actor_of


def _race(first_actor, second_actor, agent_id: str, second_name: str | None = None) -> dict:
    """Run ``first_actor``'s registration up to its uncommitted INSERT, then
    ``second_actor``'s registration, then commit the first. Answers what each got."""
    inserted, release = threading.Event(), threading.Event()
    out: dict = {}
    real_insert = services.agents._insert_new

    def first() -> None:
        try:
            with transaction.atomic():
                agent, created = services.agent_register(
                    actor=first_actor, agent_id=agent_id, card=card_03(name="First"))
                out["first"] = created
                inserted.set()
                release.wait(10)  # hold the transaction (and its uncommitted row) open
        except Exception as exc:  # pragma: no cover - reported by the assertions
            out["first"] = exc
            inserted.set()
        finally:
            connections.close_all()

    def second() -> None:
        try:
            out["second"] = services.agent_register(
                actor=second_actor, agent_id=agent_id, card=card_03(name="Second"))[1]
        except Exception as exc:
            out["second"] = exc
        finally:
            connections.close_all()

    waits: list[float] = []

    def timed_insert(agent):
        started = time.monotonic()
        try:
            return real_insert(agent)
        finally:
            waits.append(time.monotonic() - started)

    one = threading.Thread(target=first)
    one.start()
    assert inserted.wait(10)
    services.agents._insert_new = timed_insert
    try:
        two = threading.Thread(target=second, name=second_name)
        two.start()
        time.sleep(0.5)  # the second registration is now blocked in its INSERT
        assert "second" not in out
        release.set()
        one.join(10)
        two.join(10)
    finally:
        services.agents._insert_new = real_insert
    out["second_insert_waited"] = waits and waits[-1] >= 0.4
    return out


@pytest.mark.django_db(transaction=True)
def test_the_loser_of_the_insert_race_renews_the_winners_row():
    if connection.vendor != "postgresql":
        pytest.skip("the insert race exists on PostgreSQL only (see the module docstring)")
    actor = actor_of(make_client(["register"], name="racer")[0])
    out = _race(actor, actor, "raced")
    assert out["first"] is True and out["second"] is False, out
    assert out["second_insert_waited"], out  # it did meet the first's row in its INSERT
    assert Agent.objects.filter(agent_id="raced").count() == 1
    assert Agent.objects.get(agent_id="raced").name == "Second"
    assert CardVersion.objects.filter(agent__agent_id="raced").count() == 2


@pytest.mark.django_db(transaction=True)
def test_the_loser_of_the_insert_race_is_still_refused_another_clients_agent():
    if connection.vendor != "postgresql":
        pytest.skip("the insert race exists on PostgreSQL only (see the module docstring)")
    owner = actor_of(make_client(["register"], name="owner")[0])
    other = actor_of(make_client(["register"], name="other")[0])
    out = _race(owner, other, "owned")
    assert out["first"] is True, out
    assert isinstance(out["second"], PermissionDenied), out  # the owner check saw the row
    agent = Agent.objects.get(agent_id="owned")
    assert agent.name == "First" and agent.owner_id == owner.api_client_pk
    assert CardVersion.objects.filter(agent__agent_id="owned").count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_loser_whose_winner_was_deregistered_meanwhile_registers_anew():
    """The winner's row is gone again (deregistered) when the loser re-reads it: the loser
    inserts its agent anew -- once -- instead of failing with a server error."""
    if connection.vendor != "postgresql":
        pytest.skip("the insert race exists on PostgreSQL only (see the module docstring)")
    actor = actor_of(make_client(["register"], name="racer")[0])
    real_locked = services.agents._locked
    reads: list[str] = []

    def locked_after_a_deregistration(agent_id, *tenant):
        reads.append(threading.current_thread().name)
        if threading.current_thread().name == "second" and reads.count("second") == 2:
            # The second registration lost its INSERT and is about to re-read the winner's
            # row: deregister it first, from another connection, and let that commit.
            gone = threading.Thread(target=_deregister, args=(actor, agent_id))
            gone.start()
            gone.join(10)
        return real_locked(agent_id, *tenant)

    services.agents._locked = locked_after_a_deregistration
    try:
        out = _race(actor, actor, "vanishing", second_name="second")
    finally:
        services.agents._locked = real_locked
    assert out["first"] is True, out
    assert out["second"] is True, out  # inserted anew: created, no 500
    assert reads.count("second") == 2  # the locked read, the re-read that found the row gone
    agent = Agent.objects.get(agent_id="vanishing")
    assert agent.name == "Second"
    # The first's card history went with its row; the second's card is the one version.
    assert list(CardVersion.objects.filter(agent=agent).values_list("sha256", flat=True)) \
        == [agent.card_sha256]


def _deregister(actor, agent_id: str) -> None:
    try:
        services.agent_deregister(actor=actor, agent_id=agent_id)
    finally:
        connections.close_all()


@pytest.mark.django_db(transaction=True)
def test_a_registration_that_loses_twice_is_answered_409_on_both_surfaces():
    """Each time this registration inserts, another client's registration of the id has just
    committed; each time it re-reads the winner, that agent has just been deregistered. After
    two such losses it gives up with RegistrationConflict: 409 with a JSON error on the API
    and on the KubeMQ surface (both exception handlers), no row of its own, no server error."""
    if connection.vendor != "postgresql":
        pytest.skip("the insert race exists on PostgreSQL only (see the module docstring)")
    from registry.api.exceptions import exception_handler
    from registry.kubemq_api import kubemq_exception_handler

    actor = actor_of(make_client(["register"], name="loser")[0])
    rival = actor_of(make_client(["register"], name="rival")[0])
    real_insert, real_locked = services.agents._insert_new, services.agents._locked
    calls = {"insert": 0, "locked": 0}
    loser = threading.current_thread()  # the rivals' own writes go straight through

    def elsewhere(fn, *args) -> None:  # committed from another connection
        thread = threading.Thread(target=fn, args=args)
        thread.start()
        thread.join(10)

    def rival_registers(agent_id: str) -> None:
        try:
            services.agent_register(actor=rival, agent_id=agent_id, card=card_03(name="Rival"))
        finally:
            connections.close_all()

    def insert_after_a_rival(agent):
        if threading.current_thread() is not loser:
            return real_insert(agent)
        calls["insert"] += 1
        elsewhere(rival_registers, agent.agent_id)
        return real_insert(agent)

    def locked_after_a_deregistration(agent_id, *tenant):
        if threading.current_thread() is not loser:
            return real_locked(agent_id, *tenant)
        calls["locked"] += 1
        if calls["locked"] > 1:  # not the first locked read: the re-read of the winner
            elsewhere(_deregister, rival, agent_id)
        return real_locked(agent_id, *tenant)

    services.agents._insert_new = insert_after_a_rival
    services.agents._locked = locked_after_a_deregistration
    try:
        with pytest.raises(services.RegistrationConflict) as caught:
            services.agent_register(actor=actor, agent_id="contested", card=card_03())
    finally:
        services.agents._insert_new, services.agents._locked = real_insert, real_locked
    assert calls == {"insert": 2, "locked": 3}  # two tries, each lost and found gone
    assert not Agent.objects.filter(agent_id="contested").exists()
    message = "agent contested was registered and deregistered concurrently; retry"
    for handler in (exception_handler, kubemq_exception_handler):
        response = handler(caught.value, {})
        assert (response.status_code, response.data) == (409, {"error": message})
