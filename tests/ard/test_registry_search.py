"""The registry's own text search (``/api/v1/agents?q=``, the admin's search box) ranks with
ARD's hybrid ranker, registered through registry.selectors' hook: by words and by meaning,
what the caller may see and the other filters applied first, an id typed first."""

from __future__ import annotations

import re

from django.urls import reverse
from rest_framework.test import APIClient

from registry import selectors
from registry.models import Agent
from tests.conftest import make_client

AGENTS_URL = reverse("admin:registry_agent_changelist")


def _api(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _ids(client: APIClient, **params) -> list[str]:
    resp = client.get("/api/v1/agents", params)
    assert resp.status_code == 200, resp.content
    return [a["agent_id"] for a in resp.json()["results"]]


def test_the_hook_is_ards_ranking(corpus):
    found = selectors.agents_search(Agent.objects.all(), "swap my dollars into pesos")
    assert list(found.values_list("agent_id", flat=True))[:1] == ["currency"]
    ranks = [a.search_rank for a in found]
    assert ranks == list(range(len(ranks))) and len(ranks) >= 2


def test_api_q_ranks_by_meaning_after_visibility_and_filters(corpus):
    admin = _api(make_client(["admin"])[1])
    assert _ids(admin, q="do I need an umbrella when I go out later")[0] == "weather"
    assert _ids(admin, q="swap my dollars into pesos")[0] == "currency"
    # An id typed (or part of it) comes first, then the ranking's matches.
    assert _ids(admin, q="car-rent")[0] == "car-rental"
    # The other filters narrow first: the agent nearest in meaning is not among them.
    assert "currency" not in _ids(admin, q="swap my dollars into pesos", tag="weather")
    # A client that may call one agent searches that one only.
    limited = _api(make_client(["call"], agents=["weather"])[1])
    assert _ids(limited, q="swap my dollars into pesos") == []
    assert _ids(limited, q="will it rain tomorrow") == ["weather"]
    # Pages walk the ranked list once.
    whole = _ids(admin, q="plan my holiday: travel, a hotel and the weather", limit=100)
    paged = []
    for offset in range(0, len(whole), 3):
        paged += _ids(admin, q="plan my holiday: travel, a hotel and the weather",
                      limit=3, offset=offset)
    assert len(whole) >= 4 and paged == whole


def test_admin_search_box_lists_best_first(corpus, admin_client):
    def listed(**params) -> list[str]:
        html = admin_client.get(AGENTS_URL, params).content.decode()
        return re.findall(r'class="field-agent_key"><a [^>]*>([^<]+)</a>', html)

    assert listed(q="swap my dollars into pesos")[0] == "currency"
    assert listed(q="my throat is sore and I have a fever")[0] == "doctor"
    assert listed(q="hotels")[0] == "hotels"  # the id
    # A column the operator sorts by still orders the matches.
    by_id = listed(q="swap my dollars into pesos", o="1")
    assert by_id == sorted(by_id) and "currency" in by_id
