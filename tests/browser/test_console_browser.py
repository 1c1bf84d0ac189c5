"""The operator console end to end in Debian's Chromium: register an agent by URL, call it
through the real gateway, read the dashboard and the agent page, send a test message, compare
card versions, rotate a client's token, run discovery now and compare two snapshots.
Screenshots land in ``test-artifacts/console-*.png``."""

from __future__ import annotations

import re

import httpx
import orjson
import pytest
from django.contrib.auth import get_user_model

from console.models import AgentMinute, CallRecord
from discovery.models import AllowedHost, ConfiguredAgent
from gateway import recorder
from registry.models import Agent
from tests.a2a_agents import EchoAgent
from tests.browser.test_admin_browser import (
    ARTIFACTS,
    PASSWORD,
    in_thread,
    operator_page,
    require_chromium,
)
from tests.conftest import make_client

CALLS = 6


def rpc(text: str) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {
        "message": {"kind": "message", "role": "user", "messageId": "m1",
                    "parts": [{"kind": "text", "text": text}]}}})


@pytest.fixture
def console_settings(settings):
    settings.A2A_STATS_FLUSH_SECONDS = 0.2
    settings.A2A_AUTH_CACHE_SECONDS = 0  # a rotated token is refused at once
    recorder.reset()
    yield settings
    recorder.reset()


@pytest.mark.browser
def test_operator_console_end_to_end(console_settings, live_server_url, echo_agent_factory):
    require_chromium()
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(exist_ok=True)
    get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)
    caller, old_token = make_client(["call"], name="shop-frontend")
    admin_token = make_client(["admin"], name="ops-admin")[1]
    echo: EchoAgent = echo_agent_factory(card_shape="both", name="Echo Agent")
    other: EchoAgent = echo_agent_factory(card_shape="both", name="Second Echo")
    base = live_server_url

    def shot(name: str) -> None:
        page.screenshot(path=str(ARTIFACTS / f"console-{name}.png"), full_page=True)

    with operator_page(base, height=1000, timeout_ms=20_000) as page:
        expect(page.locator("#console-dashboard")).to_be_visible()
        if console_settings.EMBEDDED:  # nothing reads celery-beat's schedule there
            expect(page.locator("#content")).not_to_contain_text("Periodic tasks")

        # --- register by URL: a bad URL is refused inline, the real one registers ---
        page.goto(f"{base}/admin/registry/agent/add/")
        page.fill("#id_agent_id", "echo-agent")
        page.fill("#id_url", "http://169.254.169.254/")
        page.click("#register-submit")
        expect(page.locator(".field-url .errorlist")).to_contain_text("url:")
        shot("register-error")
        page.fill("#id_url", echo.url)
        page.fill("#id_ttl_seconds", "600")
        page.click("#register-submit")
        expect(page.locator("ul.messagelist")).to_contain_text("Registered echo-agent")
        expect(page.locator("#gateway-url")).to_have_text(f"{base}/a2a/echo-agent/")
        shot("registered")
        agent = in_thread(lambda: Agent.objects.get(agent_id="echo-agent"))
        assert agent.source == Agent.Source.ADMIN and agent.ttl_seconds == 600

        # --- real calls through the gateway ---
        with httpx.Client(base_url=base, timeout=30,
                          headers={"Authorization": f"Bearer {old_token}",
                                   "Content-Type": "application/json"}) as http:
            for i in range(CALLS):
                assert http.post("/a2a/echo-agent", content=rpc(f"hi {i}")).status_code == 200
            bad = http.post("/a2a/echo-agent", content=b'{"jsonrpc": "2.0", "id": 1, '
                            b'"method": "message/send", "params": "not an object"}')
            assert bad.status_code in (200, 400, 500)

        # --- test message from the agent page ---
        page.click("#action-test-message")
        page.fill("#id_text", "hello from the console")
        page.click("#test-message-submit")
        expect(page.locator("#reply-status")).to_have_text("200")
        expect(page.locator("#reply-executed")).to_have_text("true")
        expect(page.locator("#reply-body")).to_contain_text("hello from the console")
        shot("test-message")

        # --- the dashboard counts every call once the node has flushed ---
        expected = CALLS + 2  # the calls, the bad-params call, the test message
        in_thread(lambda: _wait(lambda: (AgentMinute.objects.filter(agent_id="echo-agent")
                                         .values_list("requests", flat=True)), expected))
        page.goto(f"{base}/admin/")
        expect(page.locator("#tile-requests .value")).to_have_text(str(expected))
        expect(page.locator("#tile-active .value")).to_have_text("1")
        expect(page.locator("#console-top-traffic td.requests").first).to_have_text(
            str(expected))
        expect(page.locator("#console-nodes")).to_contain_text("live")
        expect(page.locator("#console-traffic svg.console-chart rect.req")).not_to_have_count(0)
        shot("dashboard")

        # --- the agent list and page show the same traffic, and the health badge ---
        page.goto(f"{base}/admin/registry/agent/")
        row = page.locator("#result_list tbody tr").filter(has_text="echo-agent")
        expect(row.locator("td.field-requests_15m")).to_have_text(str(expected))
        expect(row.locator("td.field-status_display .badge")).to_have_text("active")
        expect(row.locator("td.field-seen time")).to_have_attribute(
            "title", re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"))
        shot("agent-list")
        page.goto(f"{base}/admin/registry/agent/id/echo-agent/")  # by agent id
        expect(page.locator("#traffic-recent td.requests")).to_have_text(str(expected))
        expect(page.locator("#snippet-curl")).to_contain_text(f"{base}/a2a/echo-agent/")
        shot("agent-page")

        # --- card history: a new card through the API, the diff, then refresh ---
        changed = dict(echo.card_document, name="Echo Agent v2")
        response = httpx.post(f"{base}/api/v1/agents", timeout=30,
                              headers={"Authorization": f"Bearer {admin_token}"},
                              json={"agent_id": "echo-agent", "url": echo.url,
                                    "card": changed})
        assert response.status_code == 200, response.text
        page.reload()
        page.click("#show-card-diff")
        expect(page.locator("#card-diff")).to_contain_text("Echo Agent v2")
        expect(page.locator("#card-diff span.diff_chg, #card-diff span.diff_add").first
               ).to_be_visible()
        shot("card-diff")
        page.goto(f"{base}/admin/registry/agent/id/echo-agent/")
        page.click("#action-refresh-card")
        expect(page.locator("ul.messagelist")).to_contain_text("Card refreshed: a new card")
        assert in_thread(lambda: Agent.objects.get(agent_id="echo-agent").name) == \
            "Echo Agent"

        # --- rotate the caller's token: the new one works, the old one is refused ---
        page.goto(f"{base}/admin/registry/apiclient/")
        crow = page.locator("#result_list tbody tr").filter(has_text="shop-frontend")
        expect(crow.locator("td.field-last_used time")).to_contain_text("ago")
        crow.locator("input.action-select").check()
        page.select_option("select[name=action]", "rotate")
        page.click("button[name=index]")
        message = page.locator("ul.messagelist").inner_text()
        new_token = re.search(r"The new token of shop-frontend is: (\S+) ", message).group(1)
        shot("rotate-token")
        for token, status in ((new_token, 200), (old_token, 401)):
            response = httpx.post(f"{base}/a2a/echo-agent", content=rpc("after rotation"),
                                  timeout=30, headers={"Authorization": f"Bearer {token}",
                                                       "Content-Type": "application/json"})
            assert response.status_code == status, (status, response.text)

        # --- discovery: run now twice with a config change, then compare snapshots ---
        def configure(name: str, agent: EchoAgent) -> None:
            AllowedHost.objects.get_or_create(host="127.0.0.1",
                                              defaults={"allow_http": True})
            ConfiguredAgent.objects.create(local_name=name, url=agent.base_url,
                                           description=f"{name}, reviewed")

        in_thread(lambda: configure("echo_static", echo))
        for expected_version, extra in ((1, None), (2, ("echo_second", other))):
            if extra:
                in_thread(lambda extra=extra: configure(*extra))
            page.goto(f"{base}/admin/discovery/cyclerun/")
            page.click("#run-discovery-now")
            page.click("#run-discovery-submit")
            expect(page.locator("ul.messagelist")).to_contain_text(
                f"snapshot published: v{expected_version}")
            if expected_version == 1:  # a session pins v1: it is kept, and not deletable
                response = httpx.post(f"{base}/api/v1/sessions", timeout=30,
                                      headers={"Authorization": f"Bearer {admin_token}"},
                                      json={"session_id": "s-1"})
                assert response.status_code in (200, 201), response.text
        shot("discovery-cycles")
        page.goto(f"{base}/admin/")
        expect(page.locator("#console-discovery")).to_contain_text("v2")
        page.goto(f"{base}/admin/discovery/snapshot/")
        page.locator("#result_list input.action-select").nth(0).check()
        page.locator("#result_list input.action-select").nth(1).check()
        page.select_option("select[name=action]", "compare")
        page.click("button[name=index]")
        expect(page.locator("#diff-added")).to_contain_text("echo_second")
        expect(page.locator("#diff-added h2")).to_have_text("Added (1)")
        expect(page.locator("#diff-removed h2")).to_have_text("Removed (0)")
        shot("snapshot-diff")
        page.goto(f"{base}/admin/discovery/snapshot/")
        page.get_by_role("link", name="1", exact=True).click()
        expect(page.locator(".field-delete_note")).to_contain_text(
            "Cannot be deleted: 1 session(s) pin this snapshot")
        expect(page.locator("a.deletelink")).to_have_count(0)
        shot("snapshot-pinned")

    # The audit log kept the one failed call (A2A_AUDIT=errors) and nothing else of echo-agent
    # before the rotation.
    outcomes = in_thread(lambda: list(CallRecord.objects.filter(agent_id="echo-agent")
                                      .values_list("caller", "outcome")))
    assert all(outcome != "ok" for _, outcome in outcomes)


def _wait(query, expected: int, timeout: float = 15.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while sum(query()) != expected:
        if time.monotonic() > deadline:
            raise AssertionError(f"statistics show {sum(query())} requests, not {expected}")
        time.sleep(0.1)
