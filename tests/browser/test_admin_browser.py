"""The admin driven by a real browser: Debian's Chromium through Playwright, against the whole
platform served by uvicorn (``live_server_url``). Screenshots land in ``test-artifacts/``.

Playwright's sync API keeps an asyncio loop running in this thread while the browser is open,
and Django refuses ORM calls from a thread with a running loop; mid-session database checks
therefore run in a worker thread (:func:`in_thread`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import pytest
from django.contrib.auth import get_user_model
from django.db import connections
from django.utils import timezone

from registry import services
from registry.models import Agent
from registry.permissions import SYSTEM
from tests.conftest import IN_CI
from tests.registry.cards import card_03, card_kubemq

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
PASSWORD = "correct-horse-battery-staple"

T = TypeVar("T")


def in_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` (ORM work) in a worker thread, closing its connections afterwards."""

    def run() -> T:
        try:
            return fn()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result()


def require_chromium() -> None:
    if not os.access(CHROMIUM, os.X_OK):
        message = f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)"
        if IN_CI:
            pytest.fail(f"{message}; CI=true: browser tests must run")
        pytest.skip(message)


@contextmanager
def operator_page(base: str, *, width: int = 1400, height: int = 900,
                  timeout_ms: int = 15_000) -> Iterator:
    """A page of Debian's Chromium (Playwright) logged in to the admin at ``base`` as
    ``operator`` (:data:`PASSWORD`); the browser is closed after the block."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(timeout_ms)
            page.goto(f"{base}/admin/login/?next=/admin/")
            page.fill("#id_username", "operator")
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            yield page
        finally:
            browser.close()


@pytest.mark.browser
def test_operator_manages_agents_in_the_admin(live_server_url: str):
    require_chromium()
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(exist_ok=True)
    get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)
    card = card_03(tags=("echo", "browser"))
    card["description"] = "Echoes <b>bold</b> & more"
    services.agent_register(actor=SYSTEM, agent_id="echo-agent", card=card)
    services.agent_register(actor=SYSTEM, agent_id="lapsed-agent", card=card_03(tags=("slow",)),
                            ttl_seconds=600)
    Agent.objects.filter(agent_id="lapsed-agent").update(
        status=Agent.Status.EXPIRED, expires_at=timezone.now() - timedelta(minutes=5)
    )
    services.agent_register(actor=SYSTEM, agent_id="doomed-agent",
                            card=card_kubemq("doomed-agent"), source=Agent.Source.KUBEMQ)

    with operator_page(live_server_url) as page:
        expect(page.locator("#content h1")).to_have_text("Dashboard")

        # The agent list: every agent with its status, tags and node.
        page.goto(f"{live_server_url}/admin/registry/agent/")
        rows = page.locator("#result_list tbody tr")
        expect(rows).to_have_count(3)
        echo_row = rows.filter(has=page.get_by_role("link", name="echo-agent", exact=True))
        expect(echo_row.locator("td.field-skill_tags")).to_have_text("echo, browser")
        expect(echo_row.locator("td.field-status_display")).to_have_text("active")
        lapsed_row = rows.filter(has=page.get_by_role("link", name="lapsed-agent"))
        expect(lapsed_row.locator("td.field-status_display")).to_have_text("expired")
        page.screenshot(path=str(ARTIFACTS / "admin-agents-list.png"), full_page=True)

        # Search by a skill tag.
        page.fill("#searchbar", "browser")
        page.press("#searchbar", "Enter")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text("echo-agent")

        # One agent: the card pretty-printed, its markup shown as text, and its history.
        page.get_by_role("link", name="echo-agent", exact=True).click()
        card_pre = page.locator(".form-row.field-card_pretty pre.a2a-card")
        expect(card_pre).to_contain_text('"name": "Echo Agent"')
        expect(card_pre).to_contain_text('"description": "Echoes <b>bold</b> & more"')
        assert card_pre.locator("b").count() == 0  # escaped, not rendered
        expect(page.locator("#card_versions-group")).to_contain_text("echo")
        page.screenshot(path=str(ARTIFACTS / "admin-agent-card.png"), full_page=True)

        # Extend the lapsed agent's TTL.
        page.goto(f"{live_server_url}/admin/registry/agent/")
        lapsed_row.locator("input.action-select").check()
        page.select_option("select[name=action]", "extend_ttl")
        page.click("button[name=index]")
        expect(page.locator("ul.messagelist")).to_contain_text(
            "Extended the lease of 1 agent(s)."
        )
        expect(lapsed_row.locator("td.field-status_display")).to_have_text("active")
        page.screenshot(path=str(ARTIFACTS / "admin-extend-ttl.png"), full_page=True)
        lapsed = in_thread(lambda: Agent.objects.get(agent_id="lapsed-agent"))
        assert lapsed.status == Agent.Status.ACTIVE and lapsed.is_routable
        assert lapsed.expires_at > timezone.now() + timedelta(seconds=500)  # its own TTL

        # Deregister the KubeMQ agent.
        doomed_row = rows.filter(has=page.get_by_role("link", name="doomed-agent"))
        doomed_row.locator("input.action-select").check()
        page.select_option("select[name=action]", "deregister")
        page.click("button[name=index]")
        expect(page.locator("ul.messagelist")).to_contain_text("Deregistered 1 agent(s).")
        expect(rows).to_have_count(2)
        page.screenshot(path=str(ARTIFACTS / "admin-deregister.png"), full_page=True)
        remaining = in_thread(
            lambda: sorted(Agent.objects.values_list("agent_id", flat=True))
        )
        assert remaining == ["echo-agent", "lapsed-agent"]
