"""Cards are stored compressed with lz4 on PostgreSQL (core.toast): cheaper for the database
per registration than the default pglz, and read back byte for byte."""

from __future__ import annotations

import pytest
from django.db import connection

from bench.registry_bench import bench_card
from registry import services
from registry.models import Agent, CardVersion
from tests.conftest import make_client
from tests.services_helpers import actor_of

CARD_COLUMNS = {
    ("registry_agent", "card"), ("registry_agent", "card_raw"),
    ("registry_cardversion", "card_raw"),
    ("ard_agentdoc", "entry"), ("discovery_cardblob", "raw"), ("discovery_cardblob", "card"),
}


@pytest.mark.django_db
def test_card_columns_are_lz4_compressed_and_read_back_unchanged():
    if connection.vendor != "postgresql":
        pytest.skip("column compression is PostgreSQL's (SQLite stores values as they are)")
    with connection.cursor() as cursor:
        cursor.execute("SELECT attrelid::regclass::text, attname FROM pg_attribute "
                       "WHERE attcompression = 'l'")
        assert set(cursor.fetchall()) >= CARD_COLUMNS
    import orjson

    card = bench_card(7)  # a realistic card past the size PostgreSQL compresses at
    raw = orjson.dumps(card, option=orjson.OPT_INDENT_2)
    assert len(raw) > 4096
    actor = actor_of(make_client(["register"], name="stored")[0])
    services.agent_register(actor=actor, agent_id="stored", card=raw)
    agent = Agent.objects.get(agent_id="stored")
    assert (agent.card, agent.card_raw.encode()) == (card, raw)
    version = CardVersion.objects.get(agent=agent)
    assert (version.card, version.card_raw.encode()) == (card, raw)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_column_compression(card_raw), pg_column_compression(card) "
                       "FROM registry_agent WHERE agent_id = 'stored'")
        assert cursor.fetchone() == ("lz4", "lz4")
