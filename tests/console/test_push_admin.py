"""Push deliveries and relayed configs in the console (Django's test client): the list with
what an operator needs, filters by state, agent and caller, the retry and discard actions
(and who may run them), no secret shown, the dashboard's tiles, a flat query count."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from push import relay
from push.models import PushDelivery, RelayedConfig

pytestmark = pytest.mark.django_db

LIST = reverse("admin:push_pushdelivery_changelist")
CONFIGS = reverse("admin:push_relayedconfig_changelist")


def config(agent_id: str = "agent-a", client_id: str = "client-a",
           url: str = "https://hooks.example/in?sig=very-secret") -> RelayedConfig:
    return RelayedConfig.objects.create(
        id=os.urandom(16).hex(), agent_id=agent_id, client_id=client_id, config_id="cfg",
        task_id=f"task-{os.urandom(2).hex()}", url=url, token="caller-token-value",
        authentication={"scheme": "Bearer", "credentials": "caller-credential-value"},
        secret_sha256=relay.secret_digest("agent-secret-value"))


def push(cfg: RelayedConfig, state: str = "pending", **fields) -> PushDelivery:
    sequence = cfg.deliveries.count() + 1
    return PushDelivery.objects.create(
        config=cfg, agent_id=cfg.agent_id, task_id=cfg.task_id, sequence=sequence,
        body=b'{"statusUpdate": {"taskId": "%s"}}' % cfg.task_id.encode(), state=state,
        idempotency_key=f"{cfg.pk}.{sequence}", **fields)


def rows(client, query: str = "") -> list[str]:
    """The idempotency keys the changelist shows."""
    html = client.get(f"{LIST}?{query}").content.decode()
    return [key for key in PushDelivery.objects.values_list("idempotency_key", flat=True)
            if f">{key}<" in html]


def test_the_list_shows_state_attempts_error_latency_agent_caller_task(admin_client):
    cfg = config()
    push(cfg, "delivered", attempts=2, latency_ms=123.4, last_status=200)
    push(cfg, "dead", attempts=8, last_error="HTTP 503", last_status=503)
    html = admin_client.get(LIST).content.decode()
    for text in ("badge-push-delivered", "badge-push-dead", "123 ms", "HTTP 503", "agent-a",
                 "client-a", cfg.task_id, '<td class="field-attempts">8</td>'):
        assert text in html, text
    # Read-only: no add, no edit, no stock delete.
    assert admin_client.get(reverse("admin:push_pushdelivery_add")).status_code == 403
    assert 'value="delete_selected"' not in html
    assert 'value="retry"' in html and 'value="discard"' in html
    page = admin_client.get(reverse("admin:push_pushdelivery_change",
                                    args=[cfg.deliveries.first().pk])).content.decode()
    assert "statusUpdate" in page and 'name="state"' not in page  # the body shown, no form
    assert "caller-token-value" not in page and "caller-credential-value" not in page


def test_filters_by_state_agent_and_caller(admin_client):
    a, b = config("agent-a", "client-a"), config("agent-b", "client-b")
    dead_a, pending_b = push(a, "dead"), push(b, "pending")
    failed_b = push(b, "failed")
    key = lambda *pushes: sorted(p.idempotency_key for p in pushes)  # noqa: E731
    assert sorted(rows(admin_client, "state__exact=dead")) == key(dead_a)
    assert sorted(rows(admin_client, "agent_id=agent-b")) == key(pending_b, failed_b)
    assert sorted(rows(admin_client, "caller=client-a")) == key(dead_a)
    assert sorted(rows(admin_client, "caller=client-b&state__exact=failed")) == key(failed_b)
    assert sorted(rows(admin_client, "state__in=pending,failed")) == key(pending_b, failed_b)


def _act(client, action: str, *pushes: PushDelivery):
    return client.post(LIST, {"action": action, "_selected_action": [p.pk for p in pushes]},
                       follow=True)


def test_retry_sends_failed_and_dead_pushes_back_due_now(
        admin_client, django_capture_on_commit_callbacks):
    cfg = config()
    later = timezone.now() + timedelta(hours=1)
    dead = push(cfg, "dead", attempts=8, last_error="HTTP 503",
                finished_at=timezone.now())
    failed = push(cfg, "failed", attempts=3, next_attempt_at=later)
    delivered = push(cfg, "delivered", attempts=1)
    in_flight = push(cfg, "failed", attempts=2, claimed_until=later)
    with django_capture_on_commit_callbacks() as callbacks:
        response = _act(admin_client, "retry", dead, failed, delivered, in_flight)
    assert "Retrying 2 push(es) now. 2 skipped" in response.content.decode()
    assert len(callbacks) == 1  # one delivery started for the config, after the commit
    for row in (dead, failed):
        row.refresh_from_db()
        assert (row.state, row.attempts, row.finished_at, row.claimed_until) == (
            "pending", 0, None, None)
        assert row.next_attempt_at <= timezone.now()
        assert row.last_error == ("HTTP 503" if row == dead else "")  # kept until the next
    delivered.refresh_from_db()
    in_flight.refresh_from_db()
    assert delivered.state == "delivered" and (in_flight.state, in_flight.attempts) == (
        "failed", 2)


def test_discard_deletes_what_was_not_delivered_and_logs_it(admin_client):
    cfg = config()
    dead, pending = push(cfg, "dead"), push(cfg, "pending")
    delivered = push(cfg, "delivered")
    response = _act(admin_client, "discard", dead, pending, delivered)
    assert "Discarded 2 push(es). 1 skipped" in response.content.decode()
    assert list(PushDelivery.objects.values_list("pk", flat=True)) == [delivered.pk]
    logged = LogEntry.objects.filter(action_flag=DELETION).values_list("object_id", flat=True)
    assert sorted(logged) == sorted([str(dead.pk), str(pending.pk)])


def test_actions_need_the_change_or_delete_permission(client):
    """Staff with the view permission only see the list but get neither action."""
    user = get_user_model().objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_pushdelivery"))
    client.force_login(user)
    dead = push(config(), "dead")
    html = client.get(LIST).content.decode()
    assert dead.idempotency_key in html
    assert 'value="retry"' not in html and 'value="discard"' not in html
    _act(client, "retry", dead)
    dead.refresh_from_db()
    assert dead.state == "dead"
    user.user_permissions.add(Permission.objects.get(codename="change_pushdelivery"))
    html = client.get(LIST).content.decode()
    assert 'value="retry"' in html and 'value="discard"' not in html


def test_configs_list_never_shows_a_secret(admin_client):
    cfg = config(url="https://user:pw@hooks.example/in?sig=very-secret")
    for url in (CONFIGS, reverse("admin:push_relayedconfig_change", args=[cfg.pk])):
        html = admin_client.get(url).content.decode()
        assert "https://hooks.example/in?…" in html and cfg.agent_id in html
        for secret in ("caller-token-value", "caller-credential-value", cfg.secret_sha256,
                       "very-secret", "pw@"):
            assert secret not in html, (url, secret)
    assert admin_client.get(reverse("admin:push_relayedconfig_add")).status_code == 403


def test_dashboard_tiles_count_dead_and_waiting_pushes(admin_client):
    cfg = config()
    for state in ("dead", "dead", "pending", "failed", "delivered"):
        push(cfg, state)
    html = admin_client.get(reverse("admin:index")).content.decode()
    assert 'id="tile-push-dead"><span class="value">2</span>' in html
    assert 'id="tile-push-pending"><span class="value">2</span>' in html
    assert f'{LIST}?state__exact=dead' in html


def test_deliveries_list_query_count_is_flat_from_5_to_50_rows(admin_client):
    def count(url: str) -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert admin_client.get(url).status_code == 200
        return len(ctx.captured_queries)

    def add(n: int) -> None:
        for i in range(n):
            cfg = config(f"agent-{i % 7}", f"client-{i % 3}")
            push(cfg, ("pending", "failed", "delivered", "dead")[i % 4], latency_ms=i)

    add(5)
    small = {url: count(url) for url in (LIST, f"{LIST}?caller=client-1", CONFIGS)}
    add(45)
    assert PushDelivery.objects.count() == 50
    large = {url: count(url) for url in (LIST, f"{LIST}?caller=client-1", CONFIGS)}
    assert large == small
    assert small[LIST] <= 6, small  # session, user, the page's rows (config joined), no more
