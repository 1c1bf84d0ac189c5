"""The MCP bridge across tenants (docs/tenants.md), with official MCP SDK clients of two tenants
against a running node: an agent one tenant publishes to another is news to the other tenant's
listeners when it is unpublished, shared again, and when it goes away (though its route, which
said who could see it, is gone then); ``?snapshot=`` and ``?session=`` pins are the caller's
tenant's."""

from __future__ import annotations

import asyncio
import os

from discovery.snapshots import SelectedAgent, snapshot_publish
from registry import services
from tests.mcp_bridge.clients import all_tools, run, with_client
from tests.mcp_bridge.test_notifications import Heard, _streams, _until


def test_every_tenant_that_saw_a_published_agent_hears_it_go(
        live_server_url, api, register_agent, echo_agent_factory):
    tokens = {}
    for tenant in ("acme", "beta"):
        services.tenant_create(slug=tenant)
        client, token = services.api_client_create(name=f"{tenant}-mcp", scopes=["call"],
                                                   tenant=tenant)
        tokens[tenant] = (client.client_id, token)
    key = f"acme.pub-{os.urandom(3).hex()}"
    register_agent(echo_agent_factory(), key, visibility="public")
    heard = {"acme": Heard(), "beta": Heard()}

    async def names(client) -> set[str]:
        return {tool.name for tool in await all_tools(client)}

    async def change(method: str, **body) -> None:
        response = await asyncio.to_thread(getattr(api, method), f"/api/v1/agents/{key}",
                                           **body)
        assert response.status_code in (200, 204), response.text

    async def as_beta(beta):
        await _until(lambda: _streams(tokens["beta"][0]) == 1)
        seen = [await names(beta)]
        await change("patch", json={"visibility": "private"})  # unpublished
        await heard["beta"].next()
        seen.append(await names(beta))
        await change("patch", json={"visibility": "shared", "shared_with": ["beta"]})
        await heard["beta"].next()
        seen.append(await names(beta))
        await change("delete")  # gone: only what the notifier kept says beta saw it
        await heard["beta"].next()
        seen.append(await names(beta))
        return seen

    async def as_acme(acme):
        await _until(lambda: _streams(tokens["acme"][0]) == 1)
        seen = await with_client(live_server_url, tokens["beta"][1], as_beta, mode="legacy",
                                 message_handler=heard["beta"])
        await _until(lambda: heard["acme"].count >= 1)
        return seen, await names(acme)

    beta_seen, acme_last = asyncio.run(asyncio.wait_for(with_client(
        live_server_url, tokens["acme"][1], as_acme, mode="legacy",
        message_handler=heard["acme"]), 60))

    assert [key in tools for tools in beta_seen] == [True, False, True, False]
    assert key not in acme_last
    assert heard["beta"].count == 3


def test_pins_are_the_callers_tenants(live_server_url, register_agent, echo_agent_factory):
    services.tenant_create(slug="acme")
    _, token = services.api_client_create(name="acme-pins", scopes=["call"], tenant="acme")
    bare = f"pinned-{os.urandom(3).hex()}"
    register_agent(echo_agent_factory(), f"acme.{bare}")

    def publish(tenant: str, description: str, sha: str):
        return snapshot_publish(tenant=tenant, agents=[SelectedAgent(
            local_name=bare.replace("-", "_"), description=description, agent_id=bare,
            card_sha256=sha, card_url="", source="static")])[0]

    mine = publish("acme", "Acme reviewed.", "0" * 64)
    theirs = publish("default", "Not acme's.", "1" * 64)

    def listed(path: str):
        async def use(client):
            try:
                return {tool.name: tool.description for tool in await all_tools(client)}
            except Exception as exc:  # the SDK's MCPError: the pin was refused
                return str(exc)
        return run(live_server_url, token, use, path=path)

    by_digest = listed(f"/mcp?snapshot={mine.digest}")
    assert {k: v for k, v in by_digest.items() if k != "get_task"} == {
        f"acme.{bare}": "Acme reviewed."}
    assert listed("/mcp?session=acme-1")[f"acme.{bare}"] == "Acme reviewed."
    other = listed(f"/mcp?snapshot={theirs.digest}")
    assert other == listed(f"/mcp?snapshot={'0' * 64}").replace("0" * 64, theirs.digest)
    assert "snapshot not found" in other
