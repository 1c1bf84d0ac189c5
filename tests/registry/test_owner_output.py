"""A registration's answer is rendered without a serializer per registration
(``registry.api.serializers.owner_output``): it must stay exactly what ``AgentOutput`` -- the
schema in the OpenAPI document -- renders for the owner, key order included, in any time zone."""

from __future__ import annotations

from datetime import timedelta

import orjson
import pytest
from django.utils import timezone

from registry import services
from registry.api.serializers import AgentOutput, owner_output
from registry.models import Agent
from registry.permissions import SYSTEM
from tests.conftest import make_client
from tests.registry.cards import card_03
from tests.services_helpers import actor_of


def _same(agent: Agent) -> None:
    expected = dict(AgentOutput(agent).data)
    got = owner_output(agent)
    assert got == expected
    assert list(got) == list(expected)
    assert orjson.dumps(got) == orjson.dumps(expected)


@pytest.mark.django_db
@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin"])
def test_the_registration_answer_is_the_documented_serializers(settings, zone):
    settings.TIME_ZONE = zone
    owner = actor_of(make_client(["register"], name="answer-owner")[0])
    raw = b'{"url": "http://127.0.0.1:9/", "name": "Keyed", "description": "",' \
          b' "version": "2", "skills": [], "capabilities": {}, "defaultInputModes": [],' \
          b' "defaultOutputModes": []}'
    registered, _ = services.agent_register(actor=owner, agent_id="answered", card=card_03(),
                                            credential_passthrough=True, public=True)
    _same(registered)  # as the registration answers: the owner known without a read
    _same(Agent.objects.get(agent_id="answered"))  # read back: the owner looked up
    unowned, _ = services.agent_register(actor=SYSTEM, agent_id="unowned", card=raw)
    _same(unowned)  # no owner, key order of the raw card, an empty description
    lapsed = Agent.objects.get(agent_id="unowned")
    lapsed.status = Agent.Status.EXPIRED
    lapsed.expires_at = timezone.now() - timedelta(seconds=1)
    _same(lapsed)  # not routable
    assert owner_output(lapsed)["routable"] is False
    assert list(owner_output(unowned)["card"]) == list(orjson.loads(raw))
