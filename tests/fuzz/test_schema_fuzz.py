"""Schemathesis against the live ``/api/schema/``: every documented operation is fuzzed with
valid and invalid inputs, by two clients -- an admin token and a register-scoped token -- and
every answer must conform to the schema (documented status codes, content types, bodies,
authentication) and never be a 5xx.

The operations are driven one by one with Hypothesis (schemathesis' lazy pytest fixture does
not run under this pytest); ``MAX_EXAMPLES`` bounds the run to well under a minute.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode, checks

from tests.conftest import make_client

MAX_EXAMPLES = 8
# Inputs valid for the schema but refused by the services (an agent URL that is not allowed, a
# card without an endpoint) and DRF's lenient pagination parameters are not schema mismatches.
SEMANTIC_CHECKS = [checks.positive_data_acceptance, checks.negative_data_rejection]


def _fuzz(base_url: str, token: str) -> list[str]:
    schema = schemathesis.openapi.from_url(f"{base_url}/api/schema/")
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def run(case) -> None:
                case.call_and_validate(
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=30,
                    excluded_checks=SEMANTIC_CHECKS,
                )

            try:
                run()
            except Unsatisfiable:  # no input to make invalid (e.g. a GET without parameters)
                assert mode is GenerationMode.NEGATIVE
            except (Exception, BaseExceptionGroup) as exc:  # collect every failure, report all
                failures.append(f"{operation.label} [{mode.value}]: {exc}"[:1500])
    return failures


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scopes", [["admin"], ["register", "call"]], ids=["admin", "register"])
def test_api_conforms_to_its_schema(live_server_url, scopes):
    token = make_client(scopes)[1]
    failures = _fuzz(live_server_url, token)
    assert not failures, "\n\n".join(failures)
