"""Semantic search: the bundled model, the stored embeddings, the node's vector index kept by
registry events, and the hybrid ranking's filters, entitlement, scores and pages."""

from __future__ import annotations

import socket
from datetime import timedelta

import numpy as np
import pytest
from django.core.management import call_command
from django.utils import timezone

from ard import embeddings, indexer, vectors
from ard.models import AgentDoc
from ard.query import Query, SearchRequest
from ard.ranking import HybridRanker, PostgresRanker, SqliteRanker, get_ranker
from ard.selectors import search
from registry import services
from registry.permissions import SCOPE_CALL, SYSTEM, Actor
from tests.ard.corpus import CARDS

BASE = "http://gw.test"


def _search(text: str, *, actor=None, size: int = 10, offset: int = 0, filter_=None) -> dict:
    request = SearchRequest(
        query=Query(text=text, filter=filter_ or {}), federation="none", page_size=size,
        offset=offset,
    )
    return search(actor=actor, request=request, base_url=BASE)


def _ids(body: dict) -> list[str]:
    return [r["metadata"]["agentId"] for r in body["results"]]


def test_bundled_model_loads_without_network(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("the embedder tried to reach the network")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    embedder = embeddings.WordLlamaEmbedder(dim=64)
    out = embedder.embed(["convert euros to yen", "", "weather forecast for Oslo"])
    assert out.shape == (3, 64) and out.dtype == np.float32
    assert np.allclose(np.linalg.norm(out[[0, 2]], axis=1), 1.0, atol=1e-5)
    assert not out[1].any()  # an empty text has no direction
    # Related texts are nearer than unrelated ones.
    money, weather, rain = embedder.embed(["exchange dollars", "weather", "will it rain"])
    assert weather @ rain > money @ rain
    raw = embeddings.to_bytes(out[0])
    assert len(raw) == 2 * 64 and embeddings.from_bytes(raw, 128) is None
    assert np.allclose(embeddings.from_bytes(raw, 64), out[0], atol=1e-3)


def test_vector_index_put_drop_and_nearest():
    index = vectors.VectorIndex(2, "test")
    unit = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [1.0, 0.0]], dtype=np.float32)
    index.put([10, 11, 12, 13], unit)
    assert len(index) == 4
    query = np.array([1.0, 0.0], dtype=np.float32)
    # Equal similarity: the lower id first. The floor leaves out the orthogonal one.
    assert index.nearest(query, k=10, min_similarity=0.5) == [(10, 1.0), (13, 1.0),
                                                              (12, pytest.approx(0.6))]
    assert [i for i, _ in index.nearest(query, k=2, min_similarity=-1)] == [10, 13]
    index.drop([10, 99])
    index.put([11], np.array([[1.0, 0.0]], dtype=np.float32))  # replaced in place
    assert [i for i, _ in index.nearest(query, k=10, min_similarity=0.5)] == [11, 13, 12]
    assert len(index) == 3
    index.put(list(range(100, 3100)), np.tile(unit[1], (3000, 1)))  # grows past its capacity
    assert len(index) == 3003 and index.nearest(query, k=1, min_similarity=0)[0][0] == 11


def test_documents_carry_their_embedding(corpus):
    doc = AgentDoc.objects.get(agent_id="currency")
    embedder = embeddings.get_embedder()
    assert doc.embedding_model == embedder.name == "wordllama-l2_supercat-128"
    stored = embeddings.from_bytes(doc.embedding, embedder.dim)
    fresh = embedder.embed([embeddings.document_text(doc.__dict__)])[0]
    assert float(stored @ fresh) > 0.999


def test_intent_without_a_card_word(corpus):
    """The four cases lexical search got wrong for a new user."""
    assert _ids(_search("swap my dollars into pesos"))[:3].count("currency") == 1
    assert "weather" in _ids(_search("do I need an umbrella this afternoon"))[:3]
    assert "translator" in _ids(_search("say this sentence in German"))[:3]
    assert _ids(_search("a trip to Lisbon with a plane and a hotel"))[0] in ("flights", "hotels")


def test_scores_cutoff_and_an_unrelated_query(corpus, settings):
    body = _search("how much is one bitcoin worth right now", size=100)
    scores = [r["score"] for r in body["results"]]
    assert body["results"][0]["metadata"]["agentId"] == "crypto" and scores[0] == 100
    assert all(0 <= s <= 100 for s in scores) and scores == sorted(scores, reverse=True)
    settings.ARD_MIN_SCORE = 50
    assert all(r["score"] >= 50 for r in _search("how much is one bitcoin worth")["results"])
    assert _ids(_search("xyzzy plugh")) == []  # nothing near enough, no shared word


def test_pages_are_stable_and_walk_every_match_once(corpus):
    text = "plan my holiday: travel, somewhere to sleep, money and the weather"
    whole = _ids(_search(text, size=100))
    assert len(whole) >= 6
    walked = []
    for offset in range(0, len(whole), 2):
        walked += _ids(_search(text, size=2, offset=offset))
    assert walked == whole


def test_filters_and_entitlement_apply_before_ranking(corpus, register):
    register("private-fx", {**CARDS["currency"], "name": "Private FX desk"}, public=False)
    text = "swap my dollars into pesos"
    assert "private-fx" not in _ids(_search(text, size=100))  # anonymous: public only
    limited = Actor(client_id="c", scopes=frozenset({SCOPE_CALL}),
                    allowed_agents=frozenset({"private-fx"}))
    assert "private-fx" in _ids(_search(text, actor=limited, size=100))
    other = Actor(client_id="d", scopes=frozenset({SCOPE_CALL}),
                  allowed_agents=frozenset({"weather"}))
    assert "private-fx" not in _ids(_search(text, actor=other, size=100))
    assert "private-fx" in _ids(_search(text, actor=SYSTEM, size=100))
    # A filter narrows the candidates first: the nearest agent by meaning is not among them.
    ids = {"metadata.agentId": ["weather", "tax", "invoices"]}
    assert set(_ids(_search(text, filter_=ids, size=100))) <= {"weather", "tax", "invoices"}
    ids = {"metadata.agentId": ["weather", "currency"]}
    assert _ids(_search(text, filter_=ids, size=100))[0] == "currency"


def test_index_follows_registry_events(corpus, register, django_capture_on_commit_callbacks):
    assert _ids(_search("swap my dollars into pesos"))[0] == "currency"
    index = vectors.get_index()
    size = len(index)
    # A card change re-embeds the document and the index holds the new vector at once.
    register("currency", {**CARDS["currency"], "name": "Volcano Watch",
                          "description": "Volcanic ash and eruption alerts.", "skills": []})
    assert len(index) == size
    assert "currency" not in _ids(_search("swap my dollars into pesos"))[:3]
    assert _ids(_search("is the mountain going to erupt"))[0] == "currency"
    # Deregistration drops it from the index.
    with django_capture_on_commit_callbacks(execute=True):
        services.agent_deregister(actor=SYSTEM, agent_id="currency")
    assert len(index) == size - 1
    assert "currency" not in _ids(_search("is the mountain going to erupt"))
    # Expiry hides it through the candidates (the document stays, inactive).
    with django_capture_on_commit_callbacks(execute=True):
        services.agents_expire(now=timezone.now() + timedelta(seconds=601))
    assert _ids(_search("how much is one bitcoin worth")) == []


def test_index_catches_up_with_other_nodes_writes(corpus):
    index = vectors.get_index()
    assert _ids(_search("swap my dollars into pesos"))[0] == "currency"
    embedder = embeddings.get_embedder()
    # Another node re-embedded "tax" with a volcano card and dropped "currency": rows only.
    volcano = embeddings.to_bytes(embedder.embed(["volcanic eruption alerts"])[0])
    AgentDoc.objects.filter(agent_id="tax").update(
        embedding=volcano, updated_at=timezone.now() + timedelta(seconds=1)
    )
    AgentDoc.objects.filter(agent_id="currency").delete()
    assert _ids(_search("volcanic eruption alerts"))[:1] != ["tax"]  # not caught up yet
    index.sync()  # what its thread does every ARD_SEMANTIC_SYNC_SECONDS
    assert _ids(_search("volcanic eruption alerts"))[0] == "tax"
    assert len(index) == len(CARDS) - 1


def test_a_different_model_re_embeds_on_repair(corpus, settings):
    settings.ARD_EMBEDDING_DIM = 64
    assert indexer.index_missing() == len(CARDS)
    assert set(AgentDoc.objects.values_list("embedding_model", flat=True)) == {
        "wordllama-l2_supercat-64"
    }
    assert indexer.index_missing() == 0
    assert _ids(_search("swap my dollars into pesos"))[0] == "currency"


def test_semantic_off_is_the_lexical_ranker(corpus, settings):
    settings.ARD_SEMANTIC = False
    assert isinstance(get_ranker(), PostgresRanker | SqliteRanker)
    assert vectors.get_index() is None
    assert _ids(_search("do I need an umbrella this afternoon")) == []  # no shared word
    settings.ARD_SEMANTIC = True
    assert isinstance(get_ranker(), HybridRanker)


def test_evaluate_command_prints_top3_and_mrr(corpus, tmp_path, capsys):
    queries = tmp_path / "queries.tsv"
    queries.write_text(
        "# query<TAB>agent\nswap my dollars into pesos\tcurrency\nxyzzy plugh\tweather\n"
    )
    call_command("ard_evaluate", str(queries))
    out = capsys.readouterr().out
    assert "ok   'swap my dollars into pesos' -> currency (rank 1); top 3: currency 100" in out
    assert "MISS 'xyzzy plugh' -> weather (not matched); top 3: (nothing)" in out
    assert out.strip().endswith("top 3: 1/2 (50.0 %), MRR 0.500")


@pytest.mark.django_db(transaction=True)
def test_postgresql_embeds_in_the_background(settings, django_capture_on_commit_callbacks):
    """The registration's path writes the document without a vector; the node's embedding
    thread writes it, and a search on the node waits for it."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("SQLite embeds each document as it writes it")
    settings.ARD_EMBED_DEFERRED = True
    writer = vectors.embed_writer()
    before = writer.written
    with indexer_paused(writer):
        services.agent_register(actor=SYSTEM, agent_id="currency", card=CARDS["currency"],
                                ttl_seconds=600, public=True)
        doc = AgentDoc.objects.get(agent_id="currency")
        assert (doc.embedding, doc.embedding_model) == (None, "")  # not on the request path
        assert writer.pending() == 1
    assert _ids(_search("swap my dollars into pesos")) == ["currency"]  # waits for it
    doc = AgentDoc.objects.get(agent_id="currency")
    assert doc.embedding_model == "wordllama-l2_supercat-128" and writer.written == before + 1
    assert len(vectors.get_index()) == 1
    # A card change: the old vector leaves the index at once, the new one follows.
    services.agent_register(actor=SYSTEM, agent_id="currency", ttl_seconds=600, public=True,
                            card={**CARDS["currency"], "name": "Volcano Watch",
                                  "description": "Volcanic ash and eruption alerts.",
                                  "skills": []})
    assert writer.settle(10)
    assert _ids(_search("is the mountain going to erupt")) == ["currency"]


class indexer_paused:  # noqa: N801 - used as a context manager
    """Hold the embedding thread's batch (it waits on the condition) while the block runs."""

    def __init__(self, writer: vectors.EmbedWriter) -> None:
        self.writer = writer

    def __enter__(self) -> None:
        self.writer._cond.acquire()

    def __exit__(self, *exc) -> None:
        self.writer._cond.release()


@pytest.mark.django_db(transaction=True)
def test_a_thread_catches_up_with_other_nodes(settings):
    """Rows written by "another node" (this test's connection, committed) reach the index
    through its catch-up thread, never through a search."""
    import time

    settings.ARD_SEMANTIC_SYNC_SECONDS = 0.05
    for agent_id in ("currency", "weather", "tax"):
        services.agent_register(actor=SYSTEM, agent_id=agent_id, card=CARDS[agent_id],
                                ttl_seconds=600, public=True)
    assert _ids(_search("swap my dollars into pesos"))[0] == "currency"  # loads, starts it
    index = vectors.get_index()
    embedder = embeddings.get_embedder()
    volcano = embeddings.to_bytes(embedder.embed(["volcanic eruption alerts"])[0])
    AgentDoc.objects.filter(agent_id="tax").update(embedding=volcano, updated_at=timezone.now())
    AgentDoc.objects.filter(agent_id="currency").delete()
    deadline = time.monotonic() + 10
    while len(index) != 2 or index.nearest(
            embedder.embed(["volcanic eruption alerts"])[0], k=1, min_similarity=0.9) == []:
        assert time.monotonic() < deadline, "the catch-up thread did not catch up"
        time.sleep(0.05)
    assert _ids(_search("volcanic eruption alerts"))[0] == "tax"
