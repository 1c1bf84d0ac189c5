"""The registry audit log (who registered, changed, deregistered; tokens created, rotated,
revoked) and ``manage.py clients list|revoke|rotate``."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from console.models import ClientUsage, RegistryChange
from registry import selectors, services
from registry.permissions import Actor, staff_actor
from tests.conftest import make_client
from tests.registry.cards import card_03

pytestmark = pytest.mark.django_db


def actions() -> list[tuple[str, str, str]]:
    return [(c.action, c.actor, c.agent_id or c.client_id)
            for c in RegistryChange.objects.order_by("at", "id")]


def test_registry_changes_are_audited_with_their_actor(django_capture_on_commit_callbacks):
    client, _ = make_client(["register"], name="billing-team")
    owner = Actor(client_id=client.client_id, scopes=frozenset({"register"}),
                  api_client_pk=client.pk)
    staff = staff_actor("ops")
    with django_capture_on_commit_callbacks(execute=True):
        services.agent_register(actor=owner, agent_id="billing", card=card_03())
        services.agent_register(actor=owner, agent_id="billing", card=card_03())  # renewal
        services.agent_register(actor=owner, agent_id="billing", card=card_03(tags=("v2",)))
        services.agent_update(actor=staff, agent_id="billing", max_concurrency=5)
        services.agent_deregister(actor=staff, agent_id="billing")
    assert actions()[-4:] == [
        ("agent.registered", "billing-team", "billing"),
        ("agent.card_changed", "billing-team", "billing"),
        ("agent.updated", "staff:ops", "billing"),
        ("agent.deregistered", "staff:ops", "billing"),
    ]
    change = RegistryChange.objects.get(action="agent.card_changed")
    assert len(change.details["card_sha256"]) == 64


def test_clients_command_lists_rotates_and_revokes(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        client, old_token = make_client(["call"], name="caller-one")
    ClientUsage.objects.create(client_id="caller-one", node_id="n1",
                               last_used_at="2026-01-02T03:04:05Z")
    out = io.StringIO()
    call_command("clients", "list", stdout=out)
    line = next(ln for ln in out.getvalue().splitlines() if ln.startswith("caller-one"))
    assert "call" in line and "active" in line and "2026-01-02 03:04:05" in line

    out, err = io.StringIO(), io.StringIO()
    with django_capture_on_commit_callbacks(execute=True):
        call_command("clients", "rotate", "caller-one", stdout=out, stderr=err)
    new_token = out.getvalue().strip().splitlines()[-1]
    assert new_token != old_token and "old token no longer works" in err.getvalue()
    assert selectors.actor_from_token(token=old_token) is None
    actor = selectors.actor_from_token(token=new_token)
    assert actor is not None and actor.client_id == "caller-one"
    assert actor.api_client_pk == client.pk  # same client: its agents keep their owner

    with django_capture_on_commit_callbacks(execute=True):
        call_command("clients", "revoke", "caller-one", stdout=io.StringIO())
    assert selectors.actor_from_token(token=new_token) is None
    out = io.StringIO()
    call_command("clients", "list", stdout=out)
    assert "caller-one" not in out.getvalue()
    out = io.StringIO()
    call_command("clients", "list", "--all", stdout=out)
    assert "revoked" in out.getvalue()
    kinds = [a for a, _, subject in actions() if subject == "caller-one"]
    assert kinds == ["client.created", "client.rotated", "client.revoked"]
    assert RegistryChange.objects.get(action="client.rotated").actor.startswith("cli:")

    for argv, error in ((["rotate", "caller-one"], "revoked"),
                        (["revoke", "caller-one"], "revoked already"),
                        (["rotate", "nobody"], "no client"),
                        (["revoke", "nobody"], "no client")):
        with pytest.raises(CommandError, match=error):
            call_command("clients", *argv, stdout=io.StringIO(), stderr=io.StringIO())
