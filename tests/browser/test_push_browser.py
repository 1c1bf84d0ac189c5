"""The push deliveries page driven by a real browser (Debian's Chromium through Playwright,
the whole platform served by uvicorn): an operator finds a dead-lettered push from the
dashboard's tile, retries it, and the node's delivery threads deliver it to the caller's
(loopback) webhook."""

from __future__ import annotations

import os

import pytest
from django.contrib.auth import get_user_model

from push import relay
from push.models import PushDelivery, RelayedConfig
from tests.browser.test_admin_browser import (
    ARTIFACTS,
    PASSWORD,
    in_thread,
    operator_page,
    require_chromium,
)
from tests.push.webhooks import Webhook, wait_for


@pytest.fixture
def webhook():
    hook = Webhook().start()
    yield hook
    hook.stop()


@pytest.mark.browser
def test_operator_retries_a_dead_push(live_server_url: str, webhook, settings):
    require_chromium()
    from playwright.sync_api import expect

    settings.A2A_PUSH_DELIVERY = "inprocess"  # this node's threads deliver (no worker)
    ARTIFACTS.mkdir(exist_ok=True)
    get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)
    config = RelayedConfig.objects.create(
        id=os.urandom(16).hex(), agent_id="pushing-agent", client_id="caller-app",
        task_id="task-1", url=webhook.url("retried"), token="caller-token",
        secret_sha256=relay.secret_digest("agent-secret"))
    dead = PushDelivery.objects.create(
        config=config, agent_id="pushing-agent", task_id="task-1", sequence=1,
        body=b'{"statusUpdate": {"taskId": "task-1"}}', state="dead", attempts=8,
        last_error="HTTP 503", last_status=503, idempotency_key=f"{config.pk}.1")

    with operator_page(live_server_url) as page:
        expect(page.locator("#tile-push-dead .value")).to_have_text("1")

        page.locator("#tile-push-dead a").click()
        rows = page.locator("#result_list tbody tr")
        expect(rows).to_have_count(1)
        expect(rows.first.locator("td.field-last_error_display")).to_have_text("HTTP 503")
        expect(rows.first.locator("td.field-caller")).to_have_text("caller-app")
        rows.first.locator("input.action-select").check()
        page.select_option("select[name=action]", "retry")
        page.click("button[name=index]")
        expect(page.locator("ul.messagelist")).to_contain_text("Retrying 1 push(es) now.")

        [got] = wait_for(lambda: webhook.delivered("retried"), what="the retried push")
        assert got.headers["idempotency-key"] == dead.idempotency_key
        assert got.headers["x-a2a-notification-token"] == "caller-token"
        row = in_thread(lambda: wait_for(
            lambda: PushDelivery.objects.filter(pk=dead.pk, state="delivered").first(),
            what="the push marked delivered"))
        assert (row.attempts, row.last_status) == (1, 200)
        page.goto(f"{live_server_url}/admin/push/pushdelivery/")
        expect(page.locator("#result_list td.field-state_display")).to_have_text("delivered")
        expect(page.locator("#result_list td.field-attempts")).to_have_text("1")
        page.screenshot(path=str(ARTIFACTS / "admin-push-retry.png"), full_page=True)
