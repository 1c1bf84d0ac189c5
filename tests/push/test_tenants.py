"""Relayed push configs per tenant (docs/push.md, "Tenants"): a config and its deliveries carry
the agent's tenant; an agent moved to another tenant cannot push into its old tenant's callers'
webhooks any more."""

from __future__ import annotations

import os

import httpx
import orjson
import pytest

from push.models import PushDelivery, RelayedConfig
from registry import services
from registry.permissions import SYSTEM
from tests.a2a_agents import sdk_client
from tests.gateway.conftest import Caller
from tests.push.test_relay import PUSHES, _relayed_config, _request
from tests.push.webhooks import db, wait_for


@pytest.fixture
def beta(live_server_url):
    services.tenant_create(slug="beta")
    services.tenant_create(slug="acme")
    client, token = services.api_client_create(name="beta-caller", scopes=["call"],
                                               tenant="beta")
    return Caller(client_id=client.client_id, token=token)


async def test_a_moved_agent_no_longer_pushes_to_its_old_tenants_callers(
        echo_agent_factory, register_agent, beta, webhook, live_server_url):
    agent = echo_agent_factory(card_shape="1.0", push=True, steps=2, step_delay=0.05)
    bare = f"echo-{os.urandom(3).hex()}"
    register_agent(agent, f"beta.{bare}")
    name = f"moved-{os.urandom(3).hex()}"
    base = f"{live_server_url}/a2a/t/beta/{bare}/"
    async with sdk_client(base, streaming=False, headers=beta.auth) as client:
        async for _ in client.send_message(_request("task moving", webhook.url(name), "t")):
            pass
    wait_for(lambda: len(webhook.delivered(name)) >= PUSHES, what="the pushes")
    stored = await db(lambda: RelayedConfig.objects.get(agent_id=f"beta.{bare}"))
    assert stored.tenant_id == "beta"
    tenants = await db(lambda: set(PushDelivery.objects.filter(config=stored)
                                   .values_list("tenant_id", flat=True)))
    assert tenants == {"beta"}

    # What the agent holds: its relay URL and secret. While it is beta's, a push is taken.
    relayed = _relayed_config(agent, "SendMessage")
    push = orjson.dumps({"statusUpdate": {"taskId": stored.task_id,
                                          "status": {"state": "TASK_STATE_WORKING"}}})
    headers = {"X-A2A-Notification-Token": relayed["token"],
               "Content-Type": "application/json"}
    taken = httpx.post(relayed["url"], content=push, headers=headers, timeout=10)
    assert taken.status_code == 202, taken.text
    wait_for(lambda: len(webhook.delivered(name)) >= PUSHES + 1, what="the extra push")

    await db(lambda: services.agent_move_tenant(actor=SYSTEM, agent_id=f"beta.{bare}",
                                                tenant="acme"))
    refused = httpx.post(relayed["url"], content=push, headers=headers, timeout=10)
    assert refused.status_code == 403
    assert refused.json() == {"error": f"agent beta.{bare} is no longer registered in tenant "
                                       "beta: its push configs there are void"}
    # Another agent registers the moved one's id in beta: the moved agent's configs there
    # are still void (they were relayed for the earlier registration, not for the id).
    other = echo_agent_factory(card_shape="1.0", push=True)
    register_agent(other, f"beta.{bare}")
    refused = httpx.post(relayed["url"], content=push, headers=headers, timeout=10)
    assert refused.status_code == 403, refused.text
    assert refused.json() == {"error": f"agent beta.{bare} is no longer registered in tenant "
                                       "beta: its push configs there are void"}
    count = await db(lambda: PushDelivery.objects.filter(config=stored).count())
    assert count == PUSHES + 1  # nothing stored, nothing sent to beta's webhook
    assert len([r for r in webhook.received if r.path.endswith(name)]) == PUSHES + 1


@pytest.mark.django_db
def test_the_migration_fills_the_tenant_from_the_routing_key():
    import importlib

    from django.apps import apps

    fill = importlib.import_module("push.migrations.0003_tenant").fill_tenants
    services.tenant_create(slug="acme")
    for key in ("acme.echo", "echo", "acmeish.echo"):
        config = RelayedConfig.objects.create(id=os.urandom(16).hex(), agent_id=key,
                                              client_id="c", url="https://hook.example",
                                              secret_sha256="0" * 64)
        PushDelivery.objects.create(config=config, agent_id=key, task_id="t", sequence=1,
                                    body=b"{}", idempotency_key=f"{config.pk}.1")
    fill(apps, None)
    for model in (RelayedConfig, PushDelivery):
        assert dict(model.objects.values_list("agent_id", "tenant_id")) == {
            "acme.echo": "acme", "echo": "default", "acmeish.echo": "default"}
