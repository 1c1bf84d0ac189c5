"""One ranker behind every surface that searches agents by text: ARD ``POST /search`` and
``/explore``, the registry's own search (``/api/v1/agents?q=``, the admin's box), the MCP
bridge's ``/mcp?q=`` and discovery's needs described in words rank the same agents the same
way, by meaning where no word is shared."""

from __future__ import annotations

from ard.query import ExploreRequest, Facet, Query, SearchRequest
from ard.ranking import rank_cards
from ard.selectors import agents_ranked, explore, search
from registry import selectors as registry_selectors
from registry.models import Agent
from tests.ard.corpus import CARDS
from tests.ard.corpus import QUERIES as QUERIES_TUNED
from tests.ard.heldout import HELDOUT

BASE = "http://gw.test"
#: Intents sharing no word with the card they mean, and one that means several agents.
QUERIES = ["do I need an umbrella this afternoon", "say this sentence in German",
           "a trip to Lisbon with a plane and a hotel"]


def _searched(text: str) -> list[tuple[str, int]]:
    request = SearchRequest(query=Query(text=text), federation="none", page_size=100, offset=0)
    body = search(actor=None, request=request, base_url=BASE)
    return [(r["metadata"]["agentId"], r["score"]) for r in body["results"]]


def test_every_surface_ranks_as_search_does(corpus):
    for text in QUERIES:
        searched = _searched(text)
        assert searched, text
        # /explore counts the same matched set (facets over the agents' ids).
        facets = explore(actor=None, base_url=BASE, request=ExploreRequest(
            query=Query(text=text), facets=[Facet("metadata.agentId", 1000, 1)]))
        buckets = facets["facets"]["metadata.agentId"]["buckets"]
        assert {b["value"] for b in buckets} == {a for a, _ in searched}, text
        # The registry's own search: the same agents in the same order.
        found = registry_selectors.agents_search(Agent.objects.all(), text)
        assert list(found.values_list("agent_id", flat=True)) == [a for a, _ in searched], text
        # The MCP bridge's ?q=: the same agents, order and scores.
        assert agents_ranked(text=text, agent_ids=list(CARDS)) == searched, text
        # Discovery's needs in words rank the cards themselves, registered or not (through
        # the registry's hook, as discovery calls it): the search's best is among their top 3
        # (their lexical part is the portable ranker's: the full-text engines index stored
        # documents only).
        cards = registry_selectors.cards_ranked(text=text, cards=CARDS)
        assert cards is not None and searched[0][0] in [k for k, _ in cards[:3]], text


def test_cards_ranked_unregistered_find_the_intended_agent():
    """The same relevance goals as search, on the cards alone (no database, no index)."""
    def misses(queries):
        return [(t, w) for t, w in queries
                if w not in [k for k, _ in rank_cards(text=t, cards=CARDS)[:3]]]

    assert len(misses(QUERIES_TUNED)) <= 1
    assert len(misses(HELDOUT)) <= len(HELDOUT) // 10
