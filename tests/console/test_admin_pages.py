"""Admin pages of the console with Django's test client: dashboard figures, system-made rows
without "Add", pinned snapshots without "Delete", celery-beat hidden in embedded mode, the
snapshot diff, flat query counts with statistics rows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from console.models import AgentMinute
from discovery.admin import snapshot_diff
from discovery.models import Alert, SessionPin, Snapshot
from gateway.histogram import BUCKETS
from registry import services
from registry.models import Agent
from registry.permissions import SYSTEM
from tests.registry.cards import card_03

pytestmark = pytest.mark.django_db


def minute_row(agent_id: str, node: str, requests: int, errors: int = 0, minutes_ago: int = 1,
               outcome: str = "ok") -> AgentMinute:
    hist = [0] * BUCKETS
    hist[20] = requests
    at = (timezone.now() - timedelta(minutes=minutes_ago)).replace(second=0, microsecond=0)
    return AgentMinute.objects.create(
        agent_id=agent_id, node_id=node, minute=at, requests=requests, errors_not_executed=errors,
        histogram=hist, last_call_at=at + timedelta(seconds=30), last_outcome=outcome)


def test_dashboard_sums_nodes_and_shows_health_counts(admin_client):
    services.agent_register(actor=SYSTEM, agent_id="a-live", card=card_03(), ttl_seconds=600)
    services.agent_register(actor=SYSTEM, agent_id="a-soon", card=card_03(), ttl_seconds=10)
    services.agent_register(actor=SYSTEM, agent_id="a-gone", card=card_03())
    Agent.objects.filter(agent_id="a-gone").update(status=Agent.Status.EXPIRED)
    services.node_heartbeat(node_id="n-live")
    services.node_heartbeat(node_id="n-dead")
    from registry.models import Node

    Node.objects.filter(node_id="n-dead").update(last_heartbeat=timezone.now() - timedelta(hours=1))
    minute_row("a-live", "n1", 30, errors=3)
    minute_row("a-live", "n2", 15)
    minute_row("a-soon", "n1", 5, errors=5, outcome="unreachable")
    minute_row("a-live", "n1", 999, minutes_ago=60)  # outside the 15-minute window
    Alert.objects.create(kind=Alert.Kind.REFUSED, subject="x", message="refused host")
    html = admin_client.get(reverse("admin:index")).content.decode()
    for tile, value in (("tile-active", "1"), ("tile-expiring", "1"), ("tile-expired", "1"),
                        ("tile-nodes", "1 / 1"), ("tile-requests", "50"), ("tile-alerts", "1")):
        assert f'id="{tile}"><span class="value">{value}</span>' in html, tile
    assert 'id="tile-error-rate"><span class="value">16.0 %</span>' in html
    assert "refused host" in html and "<svg" in html

    # The agent list: traffic of the window, summed over nodes, and the unreachable badge.
    listing = admin_client.get(reverse("admin:registry_agent_changelist")).content.decode()
    assert '<td class="field-requests_15m">45</td>' in listing
    assert '<td class="field-errors_15m">3</td>' in listing
    # a-soon is routable but its last call failed as unreachable: that badge wins.
    assert listing.count('<span class="badge badge-unreachable"') == 1
    assert listing.count('<span class="badge badge-active"') == 1
    assert listing.count('<span class="badge badge-expired"') == 1


def test_expiring_badge_within_30_seconds(admin_client):
    services.agent_register(actor=SYSTEM, agent_id="soon", card=card_03(), ttl_seconds=20)
    services.agent_register(actor=SYSTEM, agent_id="fine", card=card_03(), ttl_seconds=600)
    listing = admin_client.get(reverse("admin:registry_agent_changelist")).content.decode()
    assert listing.count('<span class="badge badge-expiring"') == 1
    assert listing.count('<span class="badge badge-active"') == 1


def test_agent_list_query_count_flat_with_statistics(admin_client):
    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert admin_client.get(reverse("admin:registry_agent_changelist")).status_code == 200
        return len(ctx.captured_queries)

    for i in range(3):
        services.agent_register(actor=SYSTEM, agent_id=f"agent-{i}", card=card_03())
        minute_row(f"agent-{i}", "n1", i + 1)
    small = count()
    for i in range(3, 25):
        services.agent_register(actor=SYSTEM, agent_id=f"agent-{i}", card=card_03())
        minute_row(f"agent-{i}", "n1", i + 1)
        minute_row(f"agent-{i}", "n2", i + 1, minutes_ago=2)
    assert count() == small


def test_system_rows_offer_no_add_and_beat_is_hidden(admin_client):
    index = admin_client.get(reverse("admin:index")).content.decode()
    # celery-beat's schedule is read only in distributed mode (embedded runs its own loop).
    assert ("Periodic tasks" in index) is (not settings.EMBEDDED)
    for name in ("alert", "cardcacheentry", "endpointhealth", "snapshot", "sessionpin",
                 "cyclerun"):
        assert admin_client.get(reverse(f"admin:discovery_{name}_add")).status_code == 403, name
    for name in ("callrecord", "registrychange"):
        assert admin_client.get(reverse(f"admin:console_{name}_add")).status_code == 403, name


def _snapshot(version: int, agents: list[dict]) -> Snapshot:
    return Snapshot.objects.create(version=version, digest=f"{version:064d}", agents=agents,
                                   agent_count=len(agents))


def row(name: str, sha: str, description: str = "d") -> dict:
    return {"local_name": name, "agent_id": name.replace("_", "-"), "card_sha256": sha * 64,
            "description": description, "card_url": f"http://h/{name}", "source": "static"}


def test_pinned_snapshot_cannot_be_deleted_and_says_why(admin_client):
    pinned = _snapshot(1, [row("a", "1")])
    free = _snapshot(2, [row("a", "1")])
    SessionPin.objects.create(session_id="s-1", snapshot=pinned)
    page = admin_client.get(reverse("admin:discovery_snapshot_change", args=[pinned.pk]))
    html = page.content.decode()
    assert "Cannot be deleted: 1 session(s) pin this snapshot" in html
    assert "deletelink" not in html
    assert admin_client.post(reverse("admin:discovery_snapshot_delete", args=[pinned.pk]),
                             {"post": "yes"}).status_code == 403
    changelist = admin_client.get(reverse("admin:discovery_snapshot_changelist")).content
    assert b"delete_selected" not in changelist
    assert admin_client.post(reverse("admin:discovery_snapshot_delete", args=[free.pk]),
                             {"post": "yes"}).status_code == 302
    assert list(Snapshot.objects.values_list("version", flat=True)) == [1]


def test_snapshot_diff_lists_added_removed_changed(admin_client):
    old = _snapshot(1, [row("billing", "1"), row("returns", "2"), row("legacy", "3")])
    new = _snapshot(2, [row("billing", "1"), row("returns", "9"), row("warranty", "4")])
    diff = snapshot_diff(old, new)
    assert [a["local_name"] for a in diff["added"]] == ["warranty"]
    assert [a["local_name"] for a in diff["removed"]] == ["legacy"]
    assert [(c["local_name"], c["fields"]) for c in diff["changed"]] == [
        ("returns", ["card_sha256"])]
    html = admin_client.get(reverse("admin:discovery_snapshot_diff"), {"a": 1, "b": 2}).content
    assert b"Added (1)" in html and b"Removed (1)" in html and b"Changed (1)" in html
    bad = admin_client.get(reverse("admin:discovery_snapshot_diff"), {"a": "x", "b": 99})
    assert bad.status_code == 200 and b"Choose two existing snapshot versions" in bad.content
    r = admin_client.post(reverse("admin:discovery_snapshot_changelist"), {
        "action": "compare", "_selected_action": [old.pk]}, follow=True)
    assert b"Select exactly two snapshots" in r.content


def test_alerts_are_acknowledged(admin_client):
    alert = Alert.objects.create(kind=Alert.Kind.REFUSED, subject="x", message="m")
    r = admin_client.post(reverse("admin:discovery_alert_changelist"), {
        "action": "acknowledge", "_selected_action": [alert.pk]}, follow=True)
    assert b"Acknowledged 1 alert(s)." in r.content
    alert.refresh_from_db()
    assert alert.acknowledged


def test_call_audit_log_filters(admin_client):
    from console.models import CallRecord

    now = timezone.now()

    def call(agent, caller, outcome, minutes_ago):
        CallRecord.objects.create(
            at=now - timedelta(minutes=minutes_ago), caller=caller, agent_id=agent,
            method="message/send", outcome=outcome, executed=outcome != "unreachable",
            http_status=200, latency_ms=3.0, request_bytes=10, response_bytes=20, node_id="n1")

    call("billing", "shop", "unreachable", 1)
    call("billing", "crm", "timeout", 2)
    call("returns", "shop", "unreachable", 3)
    call("returns", "shop", "agent_error", 60 * 30)
    url = reverse("admin:console_callrecord_changelist")

    def listed(**params) -> int:
        response = admin_client.get(url, params)
        assert response.status_code == 200
        return response.content.decode().count('<tr><td class="action-checkbox">') or \
            response.content.decode().count("field-caller")

    assert listed() == 4
    assert listed(agent_id="billing") == 2
    assert listed(caller="shop") == 3
    assert listed(agent_id="returns", caller="shop") == 2
    assert listed(outcome__exact="unreachable") == 2
    assert listed(**{"at__gte": (now - timedelta(hours=1)).isoformat()}) == 3
    page = admin_client.get(url, {"agent_id": "billing"}).content.decode()
    assert 'name="agent_id" value="billing"' in page  # the typed filter keeps its value
