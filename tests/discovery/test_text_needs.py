"""Needs described in words: a discovery cycle matches them with ARD's ranker (the one search
uses) against real cards served over HTTP, on the database the run uses."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError

from discovery.config_file import ConfigFileError
from discovery.loop import run_cycle
from discovery.models import CapabilityTag, Need, Snapshot
from tests.discovery.servers import EVERYDAY_AGENTS, everyday_card

pytestmark = pytest.mark.django_db

def _serve(card_server) -> list[dict[str, Any]]:
    """Every agent's card on the card server, as probe entries of the configuration."""
    probes = []
    for name in EVERYDAY_AGENTS:
        prefix = f"/a/{name}"
        card_server.set_card(prefix, everyday_card(name, card_server.base(prefix)))
        probes.append({"local_name": f"{name}_agent", "base_url": card_server.base(prefix)})
    return probes


def _selected() -> list[str]:
    snapshot = Snapshot.objects.current()
    return sorted(a["local_name"] for a in snapshot.agents) if snapshot else []


def test_a_need_in_words_selects_the_agent_meant(card_server, configure, cache):
    configure(probe=_serve(card_server), needs=[
        {"text": "convert euros to yen", "description": "Currency conversion."},
        {"text": "what should I pack for the weather in Oslo", "description": "Weather."},
    ])
    report = run_cycle(cache=cache)
    assert report.fetched == len(EVERYDAY_AGENTS)
    assert _selected() == ["money_agent", "sky_agent"]
    described = {a["local_name"]: a["description"] for a in Snapshot.objects.current().agents}
    assert described == {"money_agent": "Currency conversion.", "sky_agent": "Weather."}


def test_tag_and_text_needs_together(card_server, configure, cache):
    configure(probe=_serve(card_server), needs=[
        {"tag": "ledger", "description": "Bookkeeping."},
        {"text": "translate my letter into German", "description": "Translation."},
    ])
    run_cycle(cache=cache)
    assert _selected() == ["ledger_agent", "words_agent"]


def test_the_threshold_decides_and_the_cap_keeps_the_best(card_server, configure, cache,
                                                          settings):
    """Paying for travel abroad: the fare hunter first, the money changer close behind."""
    probes = _serve(card_server)
    need = {"text": "pay for my travel abroad", "description": "Travel money."}
    settings.DISCOVERY_NEED_TEXT_MIN_SCORE = 50
    configure(probe=probes, needs=[need])
    run_cycle(cache=cache)
    assert _selected() == ["money_agent", "trips_agent"]
    # Capped at one: the best match is kept, though its name sorts after the other's.
    configure(probe=probes, needs=[need], max_agents=1)
    report = run_cycle(cache=cache)
    assert _selected() == ["trips_agent"] and report.capped == 1
    settings.DISCOVERY_NEED_TEXT_MIN_SCORE = 95
    configure(probe=probes, needs=[need])
    run_cycle(cache=cache)
    assert _selected() == ["trips_agent"]


def test_a_need_in_words_still_asks_for_its_modes(card_server, configure, cache):
    configure(probe=_serve(card_server), needs=[
        {"text": "convert euros to yen", "description": "Currency conversion.",
         "output_modes": ["image/png"]},
    ])
    run_cycle(cache=cache)
    assert _selected() == []


def test_nonsense_matches_nothing(card_server, configure, cache):
    configure(probe=_serve(card_server), needs=[{"text": "xyzzy plugh", "description": "?"}])
    run_cycle(cache=cache)
    assert _selected() == []


def test_the_file_syncs_text_needs_and_refuses_bad_ones(configure):
    configure(needs=[{"text": "  convert euros to yen ", "description": "Currency."},
                     {"tag": "ledger", "description": "Bookkeeping."}])
    assert sorted((n.tag.name if n.tag else "", n.text) for n in Need.objects.all()) == [
        ("", "convert euros to yen"), ("ledger", "")]
    configure(needs=[{"text": "book a flight", "description": "Flights."}])
    assert [n.text for n in Need.objects.all()] == ["book a flight"]
    for bad, message in [
        ({"tag": "x", "text": "y", "description": "d"}, "not both"),
        ({"description": "d"}, "give a tag, or a text"),
        ({"text": " ", "description": "d"}, r"needs\[0\]\.text: a non-empty string"),
        ({"text": "y" * 501, "description": "d"}, "at most 500"),
    ]:
        with pytest.raises(ConfigFileError, match=message):
            configure(needs=[bad])
    with pytest.raises(ConfigFileError, match="used twice"):
        configure(needs=[{"text": "a", "description": "d"}, {"text": "a", "description": "e"}])


def test_a_need_is_a_tag_or_a_text():
    with pytest.raises(ValidationError, match="not both"):
        Need(description="d").full_clean()


def test_the_admin_adds_a_need_in_words(admin_client, card_server, configure, cache):
    from django.urls import reverse

    form = {"text": "convert euros to yen", "input_modes": "[]", "output_modes": "[]",
            "description": "Currency conversion.", "enabled": "on", "origin": "admin"}
    both = admin_client.post(reverse("admin:discovery_need_add"),
                             {**form, "tag": CapabilityTag.objects.create(name="fx").pk})
    assert both.status_code == 200 and "not both" in both.content.decode()
    added = admin_client.post(reverse("admin:discovery_need_add"), form)
    assert added.status_code == 302, added.content.decode()[:2000]
    changelist = admin_client.get(reverse("admin:discovery_need_changelist")).content.decode()
    assert "convert euros to yen" in changelist
    # The cycle uses it as a need from the file would be used.
    configure(probe=_serve(card_server))
    run_cycle(cache=cache)
    assert _selected() == ["money_agent"]
