"""Catalog entries from cards, URNs per the ARD naming guide, and the index rebuild command."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pytest
from django.core.management import call_command

from ard.documents import agent_identifier, build_document, check_settings, publisher_host
from ard.indexer import index_rebuild
from ard.models import AgentDoc
from registry.models import Agent
from tests.ard.conformance import URN_REGEX, entry_schema_errors
from tests.ard.corpus import CARDS

WHEN = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_urn_publisher_from_settings(settings):
    settings.ARD_PUBLIC_HOST = ""
    settings.A2A_PUBLIC_BASE_URL = ""
    assert publisher_host() == "agent.localhost"  # the naming guide's local placeholder
    settings.A2A_PUBLIC_BASE_URL = "http://127.0.0.1:8000"
    assert publisher_host() == "agent.localhost"  # an IP address is no publisher domain
    settings.A2A_PUBLIC_BASE_URL = "https://Agents.Example.com"
    assert agent_identifier("weather") == "urn:air:agents.example.com:a2a:weather"
    settings.ARD_PUBLIC_HOST = "acme.example"
    settings.ARD_URN_NAMESPACE = "travel:eu"
    assert agent_identifier("weather") == "urn:air:acme.example:travel:eu:weather"
    assert URN_REGEX.match(agent_identifier("weather"))
    assert check_settings() == []
    settings.ARD_URN_NAMESPACE = "bad/ns"
    assert check_settings() == ["ARD_URN_NAMESPACE 'bad/ns': letters, digits, . _ - and :"]


def test_entry_from_a_card():
    doc = build_document(
        agent_id="weather",
        card=CARDS["weather"],
        name="Weather Forecaster",
        description="Forecasts.",
        updated_at=WHEN,
    )
    entry = {**doc["entry"], "url": "https://gw.example/a2a/weather/.well-known/agent-card.json"}
    assert entry_schema_errors(entry) == []
    assert entry["tags"] == ["weather", "forecast"]
    assert entry["capabilities"] == ["forecast", "current"]
    assert entry["representativeQueries"] == [
        "Will it rain in Seattle tomorrow?",
        "7-day forecast for Berlin",
        "What's the temperature in Tokyo right now?",
    ]
    assert entry["updatedAt"] == "2026-11-30T12:00:00Z"
    assert doc["tags_index"] == "|weather|forecast|"

    # One example only: representativeQueries would break the schema's 2-5 rule, so it is left
    # out; the example is still searchable text.
    card = {
        **CARDS["legal"],
        "skills": [{**CARDS["legal"]["skills"][0], "examples": ["Review this NDA"]}],
    }
    doc = build_document(agent_id="legal", card=card, name="x", description="", updated_at=WHEN)
    assert "representativeQueries" not in doc["entry"] and "description" not in doc["entry"]
    assert doc["examples"] == "Review this NDA"
    many = {**CARDS["weather"], "skills": [{"id": "s", "examples": [f"q{i}" for i in range(9)]}]}
    doc = build_document(agent_id="w", card=many, name="w", description="", updated_at=WHEN)
    assert doc["entry"]["representativeQueries"] == ["q0", "q1", "q2", "q3", "q4"]


@pytest.mark.django_db
def test_reindex_command_rebuilds_and_prunes(register):
    register("weather", CARDS["weather"])
    register("currency", CARDS["currency"])
    AgentDoc.objects.filter(agent_id="weather").update(name="stale")
    Agent.objects.filter(agent_id="currency").delete()  # a purge: no event
    out = io.StringIO()
    call_command("ard_reindex", stdout=out)
    assert out.getvalue().strip() == "indexed 1 of 1 agent(s), pruned 1 orphaned document(s)"
    assert list(AgentDoc.objects.values_list("agent_id", "name")) == [
        ("weather", "Weather Forecaster")
    ]
    assert index_rebuild(force=False) == {"indexed": 0, "pruned": 0, "agents": 1}
