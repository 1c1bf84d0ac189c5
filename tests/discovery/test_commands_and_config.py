"""``discover --once``, ``discovery_schedule``, the DISCOVERY_CONFIG file, the Kubernetes
source's readers, and admin changelists."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from discovery.config_file import ConfigFileError, config_file_sync
from discovery.models import AllowedHost, ConfiguredAgent, DiscoveryPolicy, Need, SourceFeed
from discovery.sources import kubernetes_records
from tests.discovery.conftest import require_extra
from tests.discovery.servers import make_card, service, skill

pytestmark = pytest.mark.django_db


def test_discover_once_prints_a_summary(card_server, tmp_path, settings):
    card_server.set_card("/a/one", make_card("One", card_server.base("/a/one"),
                                             [skill("s", "x")]))
    path = tmp_path / "discovery.yaml"
    path.write_text(
        "allowlist:\n  - {host: 127.0.0.1, allow_http: true}\n"
        f"static:\n  - {{local_name: one, url: '{card_server.base('/a/one')}'}}\n"
        f"  - {{local_name: gone, url: '{card_server.base('/a/gone')}'}}\n"
    )
    settings.DISCOVERY_CONFIG = str(path)
    out, err = io.StringIO(), io.StringIO()
    call_command("discover", "--once", stdout=out, stderr=err)
    text = out.getvalue()
    assert "2 proposed, 2 admitted" in text
    assert "1 fetched (200), 0 not modified (304), 1 failed" in text
    assert "snapshot published: v1" in text
    assert "fetch error: gone:" in text and "404" in text
    assert "cards" in err.getvalue()  # the progress bar
    out = io.StringIO()
    call_command("discover", "--once", "--no-progress", stdout=out, stderr=io.StringIO())
    assert "snapshot unchanged: v1" in out.getvalue()
    assert "0 fetched (200)" in out.getvalue()  # fresh in cache: nothing refetched


def test_discovery_schedule_is_idempotent():
    from django_celery_beat.models import PeriodicTask

    for _ in range(2):
        call_command("discovery_schedule", stdout=io.StringIO())
    tasks = {t.name: t for t in PeriodicTask.objects.all()}
    cycle = tasks["discovery-cycle"]
    assert cycle.task == "discovery.tasks.discovery_cycle_task"
    assert cycle.expire_seconds <= cycle.interval.every
    assert PeriodicTask.objects.filter(name__startswith="discovery-").count() == 2


def test_beat_schedule_entry_expires_within_its_interval(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["discovery-cycle"]
    assert entry["options"]["expires"] <= entry["schedule"].total_seconds()


def test_config_file_feeds_the_models_and_follows_edits(tmp_path):
    path = tmp_path / "d.json"
    config = {
        "allowlist": [{"host": "billing.example.com"}],
        "static": [{"local_name": "billing_agent", "url": "https://billing.example.com/",
                    "description": "Invoices.", "critical": True}],
        "probe": [{"base_url": "https://partner.example.com/", "local_name": "partner_support",
                   "description": "Partner support."}],
        "registry": {"local": True, "remote": ["https://registry-b.example.com/"]},
        "kubernetes": {"label_selector": "a=b", "namespace": "agents"},
        "needs": [{"tag": "warranty", "input_modes": ["text/plain"],
                   "output_modes": ["text/plain"], "description": "Warranty."}],
        "max_agents": 7, "health": {"degrade_after": 4, "recover_after": 3},
    }
    path.write_text(json.dumps(config))
    ConfiguredAgent.objects.create(local_name="admin_row", url="https://x.example/")
    assert config_file_sync(path=str(path)).changed
    assert not config_file_sync(path=str(path)).changed  # same bytes: nothing to do
    assert ConfiguredAgent.objects.get(local_name="billing_agent").critical
    assert ConfiguredAgent.objects.get(local_name="partner_support").kind == "probe"
    assert SourceFeed.objects.count() == 3
    assert Need.objects.get().tag.name == "warranty"
    policy = DiscoveryPolicy.objects.get()
    assert (policy.max_agents, policy.degrade_after, policy.recover_after) == (7, 4, 3)
    config["static"] = []
    path.write_text(json.dumps(config))
    config_file_sync(path=str(path))
    assert set(ConfiguredAgent.objects.values_list("local_name", flat=True)) == {
        "partner_support", "admin_row"}  # the admin's row stays
    assert AllowedHost.objects.get().host == "billing.example.com"


@pytest.mark.parametrize("bad, message", [
    ({"static": [{"local_name": "9bad", "url": "https://a/"}]}, "invalid local name"),
    ({"static": [{"local_name": "a_b", "url": "https://a/"},
                 {"local_name": "a_b", "url": "https://b/"}]}, "used twice"),
    ({"needs": [{"tag": "x"}]}, "reviewed description"),
    ({"surprise": 1}, "unknown keys"),
    ({"max_agents": 0}, "positive integer"),
])
def test_config_file_errors(tmp_path, bad, message):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ConfigFileError, match=message):
        config_file_sync(path=str(path))


def test_kubernetes_source_reads_services_with_the_label(kube_api, card_server):
    kube_api.services = [
        service("warranty-agent", "agents", {"team": "a", "discover": "true"},
                card_server.base("/a/w")),
        service("Billing.Agent", "agents", {"discover": "true"}),
        service("unlabelled", "agents", {"team": "a"}),
        service("elsewhere", "other", {"discover": "true"}),
    ]
    records = kubernetes_records(label_selector="discover=true", namespace="agents",
                                 api_url=kube_api.url)
    assert [(r.local_name, r.base_url, r.source) for r in records] == [
        ("warranty_agent", card_server.base("/a/w"), "kubernetes"),
        ("billing_agent", "http://Billing.Agent.agents.svc:8080/", "kubernetes"),
    ]
    assert kube_api.requests == ["/api/v1/namespaces/agents/services"]
    everywhere = kubernetes_records(label_selector="discover=true", api_url=kube_api.url)
    assert len(everywhere) == 3


def test_kubernetes_source_with_the_official_client(kube_api, card_server):
    # httpx reads the Kubernetes API without it; the official client is an optional extra.
    require_extra("kubernetes", "pip install kubernetes")
    kube_api.services = [service("warranty-agent", "agents", {"discover": "true"},
                                 card_server.base("/a/w"))]
    records = kubernetes_records(label_selector="discover=true", namespace="agents",
                                 api_url=kube_api.url, options={"client": "official"})
    assert [r.local_name for r in records] == ["warranty_agent"]


def test_admin_changelists_have_flat_query_counts(admin_client, configure):
    from django.urls import reverse

    from discovery.models import Alert, CardCacheEntry, SessionPin, Snapshot

    def grow(n: int) -> None:
        base = Snapshot.objects.count()
        for i in range(n):
            snap = Snapshot.objects.create(version=base + i + 1, digest=f"{base + i:064x}")
            SessionPin.objects.create(session_id=f"s{base + i}", snapshot=snap)
            Alert.objects.create(kind="cap_reached", subject=f"x{i}", message="m")
            CardCacheEntry.objects.create(card_url=f"https://h{base + i}/c",
                                          expires_at="2030-01-01T00:00:00Z")
        configure(needs=[{"tag": f"t{j}", "description": "d"} for j in range(base + n)])

    names = ["snapshot", "sessionpin", "alert", "cardcacheentry", "need", "capabilitytag"]
    counts = {}
    for size in (2, 12):
        grow(size - (2 if size == 12 else 0))
        for name in names:
            url = reverse(f"admin:discovery_{name}_changelist")
            from django.db import connection
            from django.test.utils import CaptureQueriesContext

            with CaptureQueriesContext(connection) as ctx:
                assert admin_client.get(url).status_code == 200
            counts.setdefault(name, []).append(len(ctx.captured_queries))
    assert all(a == b for a, b in counts.values()), counts


def test_cycle_list_tells_a_kept_snapshot_from_a_broken_config_file(card_server, tmp_path,
                                                                     settings, admin_client):
    """Real cycles: the first publishes, the second keeps the snapshot (not a failure), the
    third runs with a configuration file that no longer parses (flagged, though the cycle
    still ran on the rows read before)."""
    import re

    from django.urls import reverse

    from discovery.loop import run_cycle

    card_server.set_card("/a/one", make_card("One", card_server.base("/a/one"),
                                             [skill("s", "x")]))
    path = tmp_path / "discovery.yaml"
    path.write_text(
        "allowlist:\n  - {host: 127.0.0.1, allow_http: true}\n"
        f"static:\n  - {{local_name: one, url: '{card_server.base('/a/one')}'}}\n")
    settings.DISCOVERY_CONFIG = str(path)
    assert run_cycle().published
    kept = run_cycle()
    assert not kept.published and kept.version == 1
    path.write_text("static: [unclosed\n")
    broken = run_cycle()
    assert broken.config_error

    html = admin_client.get(reverse("admin:discovery_cyclerun_changelist")).content.decode()
    rows = re.findall(r'<tr>.*?</tr>', html.split("<tbody>", 1)[1], re.S)
    health = [re.search(r'field-health_display">(.*?)</td>', r, re.S).group(1) for r in rows]
    snapshot = [re.search(r'field-snapshot_display">(.*?)</td>', r).group(1) for r in rows]
    assert [re.sub(r"<[^>]+>", "", h) for h in health] == ["config error", "ok", "ok"]
    assert "badge-dead" in health[0] and "config file error" in health[0]
    assert snapshot == ["v1 kept (unchanged)", "v1 kept (unchanged)", "v1 published (new)"]
    assert 'alt="False"' not in html  # no red cross for a snapshot kept
