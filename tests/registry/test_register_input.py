"""The registration's input validation from one serializer per thread answers exactly what a
fresh ``AgentRegisterInput`` does, call after call (no state carried from one to the next)."""

from __future__ import annotations

import pytest
from rest_framework.exceptions import ValidationError

from registry.api.serializers import AgentRegisterInput
from registry.api.views import register_input

_INPUTS = [
    {"agent_id": "ok-1", "card": {"name": "x"}, "ttl_seconds": 30},
    None,
    [],
    "text",
    {},
    {"agent_id": 5},
    {"agent_id": "a", "ttl_seconds": "3"},
    {"agent_id": "a", "ttl_seconds": True, "max_concurrency": 0},
    {"agent_id": "ok-2", "url": "http://example.com/"},
    {"zzz": 1, "agent_id": "a"},
    {"agent_id": "a", "card": [1]},
    {"agent_id": "a", "public": "yes", "credential_passthrough": 1},
    {"agent_id": "x" * 201},
    {"agent_id": "ok-3", "public": True, "credential_passthrough": False, "max_concurrency": 7},
]


def _fresh(data):
    serializer = AgentRegisterInput(data=data)
    try:
        serializer.is_valid(raise_exception=True)
    except ValidationError as exc:
        return "refused", exc.detail
    return "valid", dict(serializer.validated_data)


def _reused(data):
    try:
        return "valid", dict(register_input(data))
    except ValidationError as exc:
        return "refused", exc.detail


@pytest.mark.parametrize("rounds", [2])
def test_reused_serializer_answers_as_a_fresh_one(rounds):
    for _ in range(rounds):
        for data in _INPUTS:
            assert _reused(data) == _fresh(data), data
