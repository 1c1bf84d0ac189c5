"""The discovery loop end to end, against real card servers and a Kubernetes API stand-in."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from discovery import sessions, tree_factory
from discovery.loop import run_cycle
from discovery.models import Alert, EndpointHealth, Snapshot
from discovery.snapshots import snapshot_digest
from registry.models import Agent
from tests.discovery.servers import WELL_KNOWN, make_card, service, skill

pytestmark = pytest.mark.django_db

TEXT = {"input_modes": ["text/plain"], "output_modes": ["text/plain"]}
LABEL = {"a2a.example.com/discover": "true"}


def _card(server, prefix: str, *skills) -> bytes:
    return server.set_card(prefix, make_card(f"Card name {prefix}", server.base(prefix),
                                             list(skills)))


def _names(snapshot: Snapshot) -> list[str]:
    return [a["local_name"] for a in snapshot.agents]


def _at(clock, hhmm: str, seconds: int = 0) -> None:
    hours, minutes = map(int, hhmm.split(":"))
    clock.now = datetime(2025, 6, 2, hours, minutes, seconds, tzinfo=UTC).timestamp()


def test_a_morning_of_changes(card_server, kube_api, configure, cache, clock, settings):
    """The seed's worked example, 10:00 to 10:30."""
    settings.DISCOVERY_FETCH_TIMEOUT_SECONDS = 0.3
    _card(card_server, "/a/billing", skill("invoices", "billing"))
    _card(card_server, "/a/returns", skill("returns", "returns"))
    _card(card_server, "/a/warranty", skill("claims", "warranty"))
    kube_api.services = [service("returns-agent", "agents", LABEL, card_server.base("/a/returns"))]
    configure(
        static=[{"local_name": "billing_agent", "url": card_server.base("/a/billing"),
                 "description": "Invoices, payments and refunds.", "critical": True}],
        kubernetes={"label_selector": "a2a.example.com/discover=true", "namespace": "agents",
                    "api_url": kube_api.url},
        needs=[{"tag": "warranty", **TEXT, "description": "Warranty claims and coverage."},
               {"tag": "returns", **TEXT, "description": "Returns and exchanges."}],
        health={"degrade_after": 3, "recover_after": 2},
    )

    # 10:00 — digest A: billing_agent (static) and returns_agent (platform label).
    _at(clock, "10:00")
    report = run_cycle(cache=cache)
    assert report.published and report.fetched == 2
    snap_a = Snapshot.objects.current()
    assert _names(snap_a) == ["billing_agent", "returns_agent"]
    by_name = {a["local_name"]: a for a in snap_a.agents}
    assert by_name["billing_agent"]["description"] == "Invoices, payments and refunds."
    assert by_name["returns_agent"]["description"] == "Returns and exchanges."  # the need's
    early, _ = sessions.session_pin(session_id="early")
    assert early.snapshot.digest == snap_a.digest

    # 10:05 — a warranty agent is deployed with the label: snapshot 2, digest B.
    _at(clock, "10:05")
    kube_api.services.append(
        service("warranty-agent", "agents", LABEL, card_server.base("/a/warranty")))
    report = run_cycle(cache=cache)
    assert report.published and report.version == 2
    snap_b = Snapshot.objects.current()
    assert _names(snap_b) == ["billing_agent", "returns_agent", "warranty_agent"]
    assert sessions.session_get(session_id="early").snapshot.digest == snap_a.digest
    late, _ = sessions.session_pin(session_id="late")
    assert late.snapshot.digest == snap_b.digest
    builds = tree_factory.stats["builds"]
    tree = tree_factory.tree_for(late.snapshot, base_url="http://gw")
    assert tree_factory.tree_for(
        sessions.session_get(session_id="late").snapshot, base_url="http://gw") is tree
    assert tree_factory.stats["builds"] == builds + 1  # one build of root B
    warranty = next(a for a in tree.agents if a.local_name == "warranty_agent")
    assert warranty.gateway_url == "http://gw/a2a/warranty-agent/"
    assert warranty.card["url"] == "http://gw/a2a/warranty-agent/"
    assert Agent.objects.routable().filter(
        agent_id="warranty-agent", source=Agent.Source.DISCOVERY).exists()

    # 10:20 — the returns team adds a skill: same endpoint, new bytes -> digest C + alert.
    _at(clock, "10:20")
    _card(card_server, "/a/returns", skill("returns", "returns"), skill("exchange", "returns"))
    report = run_cycle(cache=cache)
    assert report.published and report.version == 3
    snap_c = Snapshot.objects.current()
    assert snap_c.digest not in (snap_a.digest, snap_b.digest)
    changed = Alert.objects.filter(kind=Alert.Kind.SKILLS_CHANGED).get()
    assert changed.details["local_name"] == "returns_agent"
    assert not Alert.objects.filter(kind=Alert.Kind.ENDPOINT_CHANGED).exists()

    # 10:30 — the warranty card endpoint times out: stale card served, backoff, then degraded
    # after 3 failures and left out of the next snapshot.
    _at(clock, "10:30")
    card_server.hang["/a/warranty"] = 2
    report = run_cycle(cache=cache)
    assert report.failed == 1 and not report.published  # stale card keeps digest C
    entry = cache.get(card_server.url + "/a/warranty" + WELL_KNOWN)
    assert entry.has_card and entry.failures == 1
    assert entry.expires_at == clock.now + 5
    clock.advance(2)
    assert run_cycle(cache=cache).failed == 0  # backing off: no request
    clock.advance(3)
    assert run_cycle(cache=cache).failed == 1  # second failure, next retry in 10 s
    clock.advance(10)
    report = run_cycle(cache=cache)
    assert report.failed == 1 and report.newly_degraded == ["warranty_agent"]
    assert report.published
    snap_d = Snapshot.objects.current()
    assert _names(snap_d) == ["billing_agent", "returns_agent"]
    assert Alert.objects.filter(kind=Alert.Kind.FETCH_FAILURES).count() == 1
    # Pinned sessions still resolve to their digests; the one pinning B keeps warranty routable.
    assert sessions.session_get(session_id="early").snapshot.digest == snap_a.digest
    assert sessions.session_get(session_id="late").snapshot.digest == snap_b.digest
    assert Agent.objects.routable().filter(agent_id="warranty-agent").exists()
    assert card_server.count("/a/billing") == 4  # 10:00, 10:05, 10:20 and 10:30:15 (304s)


def test_304_publishes_nothing_new(card_server, configure, cache, clock):
    _card(card_server, "/a/one", skill("s", "billing"))
    configure(static=[{"local_name": "one", "url": card_server.base("/a/one")}])
    first = run_cycle(cache=cache)
    assert first.published and first.version == 1
    clock.advance(301)
    again = run_cycle(cache=cache)
    assert again.not_modified == 1 and again.fetched == 0 and not again.published
    assert Snapshot.objects.count() == 1 and cache.parse_count == 1
    assert again.digest == snapshot_digest([("one", first_sha(card_server, "/a/one"))])


def first_sha(server, prefix):
    import hashlib

    return hashlib.sha256(server.cards[prefix]).hexdigest()


def test_changed_bytes_new_digest_and_skill_alert(card_server, configure, cache, clock):
    _card(card_server, "/a/one", skill("s", "billing"))
    configure(static=[{"local_name": "one", "url": card_server.base("/a/one")}])
    v1 = run_cycle(cache=cache)
    _card(card_server, "/a/one", skill("s", "billing"), skill("t", "refund"))
    clock.advance(301)
    v2 = run_cycle(cache=cache)
    assert v2.published and v2.digest != v1.digest and v2.version == 2
    assert v2.digest == snapshot_digest([("one", first_sha(card_server, "/a/one"))])
    alert = Alert.objects.get(kind=Alert.Kind.SKILLS_CHANGED)
    assert alert.details["after"] == [["s", ["billing"]], ["t", ["refund"]]]


def test_degraded_after_three_failures_back_after_two_successes(
    card_server, configure, cache, clock
):
    _card(card_server, "/a/a", skill("s", "x"))
    _card(card_server, "/a/b", skill("s", "x"))
    configure(static=[{"local_name": "agent_a", "url": card_server.base("/a/a")},
                      {"local_name": "agent_b", "url": card_server.base("/a/b")}])
    assert _names(run_cycle(cache=cache) and Snapshot.objects.current()) == ["agent_a", "agent_b"]
    card_server.down.add("/a/b")
    clock.advance(301)
    for expected_failures in (1, 2):
        report = run_cycle(cache=cache)
        assert report.failed == 1 and not report.published  # stale card still selected
        assert EndpointHealth.objects.get(card_url__contains="/a/b/").failure_streak == \
            expected_failures
        clock.advance(400)
    report = run_cycle(cache=cache)
    assert report.newly_degraded == ["agent_b"] and report.published
    assert _names(Snapshot.objects.current()) == ["agent_a"]
    card_server.down.clear()
    clock.advance(400)
    report = run_cycle(cache=cache)  # one success: still degraded
    assert report.not_modified >= 1 and report.degraded == 1 and not report.published
    report = run_cycle(cache=cache)  # second success (revalidated at once while degraded)
    assert report.recovered == ["agent_b"] and report.published
    assert _names(Snapshot.objects.current()) == ["agent_a", "agent_b"]


def test_allowlist_refuses_a_proposed_host(card_server, kube_api, configure, cache):
    _card(card_server, "/a/ok", skill("s", "warranty"))
    kube_api.services = [
        service("good", "agents", LABEL, card_server.base("/a/ok")),
        service("sneaky", "agents", LABEL, "https://evil.example.com/"),
        service("plain", "agents", LABEL, card_server.base("/a/ok").replace(
            "127.0.0.1", "localhost")),
        service("metadata", "agents", LABEL, "http://169.254.169.254/"),
    ]
    configure(
        allowlist=[{"host": "127.0.0.1", "allow_http": True}, {"host": "localhost"},
                   {"host": "169.254.169.254", "allow_http": True}],
        kubernetes={"label_selector": "a2a.example.com/discover=true", "namespace": "agents",
                    "api_url": kube_api.url},
        needs=[{"tag": "warranty", **TEXT, "description": "Warranty."}],
    )
    report = run_cycle(cache=cache)
    assert report.admitted == 1 and report.refused == 3
    assert _names(Snapshot.objects.current()) == ["good"]
    reasons = {a.details["local_name"]: a.details["reason"]
               for a in Alert.objects.filter(kind=Alert.Kind.REFUSED)}
    assert "not on the discovery allowlist" in reasons["sneaky"]
    assert "https required" in reasons["plain"]
    assert "refused" in reasons["metadata"]  # link-local/metadata: always, even if listed
    assert set(card_server.counts) == {"/a/ok"}  # nothing fetched from refused hosts


def test_name_collision_is_refused_and_alerted(card_server, kube_api, configure, cache):
    _card(card_server, "/a/one", skill("s", "warranty"))
    _card(card_server, "/a/two", skill("s", "warranty"))
    kube_api.services = [
        service("support-agent", "agents", LABEL, card_server.base("/a/one")),
        service("support_agent", "agents", LABEL, card_server.base("/a/two")),
    ]
    configure(
        kubernetes={"label_selector": "a2a.example.com/discover=true", "namespace": "agents",
                    "api_url": kube_api.url},
        needs=[{"tag": "warranty", **TEXT, "description": "Warranty."}],
    )
    report = run_cycle(cache=cache)
    assert report.collisions == 1
    snap = Snapshot.objects.current()
    assert _names(snap) == ["support_agent"] and snap.agent_count == 1
    alert = Alert.objects.get(kind=Alert.Kind.NAME_COLLISION)
    assert "support_agent" in alert.message
    assert run_cycle(cache=cache).collisions == 1
    assert Alert.objects.filter(kind=Alert.Kind.NAME_COLLISION).count() == 1  # not re-raised


def test_registry_id_taken_by_another_source_is_a_collision(card_server, configure, cache):
    from registry import services
    from registry.permissions import SYSTEM

    card = make_card("Theirs", "http://127.0.0.1:9/", [skill("s", "x")])
    services.agent_register(actor=SYSTEM, agent_id="billing-agent", card=card)
    _card(card_server, "/a/billing", skill("s", "billing"))
    configure(static=[{"local_name": "billing_agent", "url": card_server.base("/a/billing")}])
    run_cycle(cache=cache)
    assert Snapshot.objects.current().agent_count == 0
    assert Agent.objects.get(agent_id="billing-agent").source == Agent.Source.API
    assert Alert.objects.filter(kind=Alert.Kind.NAME_COLLISION, subject="billing-agent").exists()


def test_cap_keeps_critical_first_and_alerts(card_server, configure, cache):
    static = []
    for i in range(5):
        _card(card_server, f"/a/n{i}", skill("s", "x"))
        static.append({"local_name": f"agent_{i}", "url": card_server.base(f"/a/n{i}"),
                       "critical": i == 4})
    configure(static=static, max_agents=3)
    report = run_cycle(cache=cache)
    assert report.capped == 2 and report.selected == 3
    assert _names(Snapshot.objects.current()) == ["agent_0", "agent_1", "agent_4"]
    alert = Alert.objects.get(kind=Alert.Kind.CAP_REACHED)
    assert alert.details["left_out"] == ["agent_2", "agent_3"]


def test_matcher_modes_and_policy_hook(card_server, kube_api, configure, cache, settings):
    skills = {
        "text": skill("s", "warranty"),  # inherits the card's text/plain defaults
        "json_only": skill("s", "warranty", inputModes=["application/json"]),
        "both": skill("s", "warranty", inputModes=["application/json", "text/plain"]),
        "other_tag": skill("s", "billing"),
        "blocked": skill("s", "warranty"),
    }
    for name, sk in skills.items():
        _card(card_server, f"/a/{name}", sk)
    kube_api.services = [service(n, "agents", LABEL, card_server.base(f"/a/{n}")) for n in skills]
    settings.DISCOVERY_POLICY_HOOK = "tests.discovery.test_loop.no_blocked_agents"
    configure(
        kubernetes={"label_selector": "a2a.example.com/discover=true", "namespace": "agents",
                    "api_url": kube_api.url},
        needs=[{"tag": "warranty", **TEXT, "description": "Warranty."}],
    )
    run_cycle(cache=cache)
    assert _names(Snapshot.objects.current()) == ["both", "text"]


def no_blocked_agents(need, record, card) -> bool:
    """A tenant policy: this tenant's data may not go to the agent named blocked."""
    return record.local_name != "blocked"


def test_unconfigured_cycle_is_cheap_and_quiet(django_assert_max_num_queries, settings):
    settings.DISCOVERY_CONFIG = None
    with django_assert_max_num_queries(2):
        report = run_cycle()
    assert not report.configured and "not configured" in report.summary()
    assert not Snapshot.objects.exists() and not Alert.objects.exists()


def test_local_registry_source(configure, cache, settings):
    from registry import services
    from registry.permissions import SYSTEM

    card = make_card("Reg", "http://127.0.0.1:9/", [skill("s", "warranty")])
    services.agent_register(actor=SYSTEM, agent_id="reg-agent", card=card)
    configure(registry={"local": True},
              needs=[{"tag": "warranty", **TEXT, "description": "Warranty."}])
    report = run_cycle(cache=cache)
    assert report.fetched == 0  # the registry holds the card: nothing to fetch
    (agent,) = Snapshot.objects.current().agents
    assert agent["local_name"] == "reg_agent" and agent["agent_id"] == "reg-agent"
