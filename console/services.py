"""Console writes: rotate an API client's token, refresh an agent's card, send an agent a test
message through the gateway. Registry rules stay in registry.services; these compose them."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass

import orjson
from asgiref.sync import async_to_sync
from django.db import transaction

from registry import events, services
from registry.ids import DEFAULT_TENANT, split_agent_key
from registry.models import Agent, ApiClient
from registry.permissions import SCOPE_CALL, Actor

CONSOLE_CLIENT_ID = "admin-console"
TEST_TIMEOUT_SECONDS = 30
MAX_SHOWN_BYTES = 64 * 1024


def client_rotate(*, client_id: str, actor: Actor | None = None, audit: bool = True) -> str:
    """Give a client a new token and invalidate the old one; answers the new token (shown
    once). The client keeps its id, scopes and agents. Caches of the old token (gateway and
    heartbeat fast paths) expire within ``A2A_AUTH_CACHE_SECONDS``."""
    with transaction.atomic():
        client = ApiClient.objects.select_for_update().filter(client_id=client_id).first()
        if client is None:
            raise services.InvalidInput(f"no client {client_id!r}")
        if client.revoked:
            raise services.InvalidInput(f"{client_id} is revoked: create a new client instead")
        # Verification looks the key up by prefix and checks the hash: a new prefix and hash
        # make the old token unknown. The primary key (agents' owner link) stays.
        token, prefix, hashed = ApiClient.objects.key_generator.generate()
        client.prefix, client.hashed_key = prefix, hashed
        client.save(update_fields=["prefix", "hashed_key"])
        if audit:
            events.audit(
                events.AuditRecord(
                    action="client.rotated",
                    actor=actor.client_id if actor else "system",
                    client_id=client_id,
                    details={"prefix": prefix},
                )
            )
    return token


def client_revoke(*, client_id: str, actor: Actor | None = None) -> ApiClient:
    return services.api_client_update(client_id=client_id, revoked=True, actor=actor)


def agent_refresh_card(*, actor: Actor, agent_id: str) -> tuple[Agent, bool]:
    """Fetch the agent's card again from its URL, validated as a registration; answers the
    agent and whether the card changed. The lease, cap, source and node are kept.
    ``agent_id``: its routing key (registry.ids.agent_key)."""
    tenant, bare = split_agent_key(agent_id)
    agent = Agent.objects.filter(tenant_id=tenant, agent_id=bare).first()
    if agent is None:
        raise services.AgentNotFound(agent_id)
    before = agent.card_sha256
    agent, _ = services.agent_register(
        actor=actor,
        agent_id=agent_id,
        url=agent.url,
        ttl_seconds=agent.ttl_seconds,
        max_concurrency=agent.max_concurrency,
        source=agent.source,
        node_id=agent.node_id or None,
    )
    return agent, agent.card_sha256 != before


@dataclass
class TestReply:
    status: int
    executed: str
    content_type: str
    body: str
    seconds: float


def _console_token(tenant: str) -> str:
    """A fresh token of the console's own caller in ``tenant`` (one client per tenant, created
    on first use, so a test message reaches the agent as a caller of its own tenant; rotated
    each time, so no usable token is ever kept anywhere)."""
    client_id = CONSOLE_CLIENT_ID if tenant == DEFAULT_TENANT else f"{CONSOLE_CLIENT_ID}-{tenant}"
    if not ApiClient.objects.filter(client_id=client_id).exists():
        _, token = services.api_client_create(
            name="admin console (test messages)", scopes=[SCOPE_CALL], client_id=client_id,
            tenant=tenant,
        )
        return token
    return client_rotate(client_id=client_id, audit=False)


async def _call_gateway(agent_id: str, body: bytes, token: str) -> tuple[int, dict, bytes]:
    from gateway import inprocess, runtime

    # The process's running node (the one the gateway serves /a2a from); started here when no
    # server started one (a management shell, a test without a live server).
    node = runtime.current_node() or await runtime.host.ensure()
    reply = await asyncio.wait_for(
        inprocess.call(node, agent_id, body, max_bytes=MAX_SHOWN_BYTES, headers=[
            (b"content-type", b"application/json"),
            (b"authorization", f"Bearer {token}".encode()),
        ]),
        TEST_TIMEOUT_SECONDS + 15,
    )
    return reply.status, reply.headers, reply.body


def agent_test_message(*, agent_id: str, text: str) -> TestReply:
    """Send ``text`` as an A2A ``message/send`` through the gateway path (auth, routing,
    virtual subscriber, agent) and answer what a caller would get back."""
    token = _console_token(split_agent_key(agent_id)[0])
    body = orjson.dumps(
        {
            "jsonrpc": "2.0",
            "id": f"console-{uuid.uuid4().hex[:8]}",
            "method": "message/send",
            "params": {
                "message": {
                    "kind": "message",
                    "role": "user",
                    "messageId": uuid.uuid4().hex,
                    "parts": [{"kind": "text", "text": text}],
                },
                "configuration": {"timeout": TEST_TIMEOUT_SECONDS},
            },
        }
    )
    started = time.perf_counter()
    status, headers, reply = async_to_sync(_call_gateway)(agent_id, body, token)
    try:
        shown = orjson.dumps(orjson.loads(reply), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        shown = reply.decode("utf-8", errors="replace")
    return TestReply(
        status=status,
        executed=headers.get("x-a2a-executed", ""),
        content_type=headers.get("content-type", ""),
        body=shown,
        seconds=time.perf_counter() - started,
    )
