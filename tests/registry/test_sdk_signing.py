"""The a2a-sdk's private signing helpers behave as ``registry/sdk_signing.py`` relies on.

Each assertion pins an exact output on a known input. When one fails after an a2a-sdk upgrade,
the SDK changed a helper that is not part of its public API: read the new helper, adapt
``registry/sdk_signing.py`` (the only importer) and the card-signature tests, then update this
file. Do not loosen these expectations to make an upgrade pass.
"""

from __future__ import annotations

import pytest
from a2a.client.card_resolver import parse_agent_card

from registry import sdk_signing

SDK_CHANGED = "a2a-sdk changed a private signing helper: adapt registry/sdk_signing.py"


def test_canonicalize_is_rfc8785():
    # Keys sorted by UTF-16 code units, no spaces, numbers in ECMAScript form, UTF-8 kept.
    value = {"b": 1, "a": [1, {}], "é": "é", "d": 1.0, "e": 1e21, "c": 0.1, "\u20ac": 2,
             "f": -0.0, "A": None, "t": True}
    expected = '{"A":null,"a":[1,{}],"b":1,"c":0.1,"d":1,"e":1e+21,"f":0,"t":true,"é":"é","€":2}'
    assert sdk_signing.canonicalize(value) == expected, SDK_CHANGED


def test_clean_empty_removes_empty_strings_lists_and_objects_only():
    value = {"a": "", "b": [], "c": {"d": None, "e": 0, "f": False, "g": {"h": ""}},
             "i": "x", "j": [[], "", {}, "y"], "k": None}
    assert sdk_signing.clean_empty(value) == {
        "c": {"e": 0, "f": False}, "i": "x", "j": ["y"]}, SDK_CHANGED
    assert sdk_signing.clean_empty({"a": ""}) is None, SDK_CHANGED


def test_clean_empty_bounds_nesting_with_a_value_error():
    deep: object = "x"
    for _ in range(200):
        deep = {"k": deep}
    with pytest.raises(ValueError):
        sdk_signing.clean_empty(deep)


def test_a_card_payload_drops_its_signatures_and_empty_values():
    card = {"name": "n", "description": "", "skills": [], "url": "http://a/",
            "signatures": [{"protected": "p", "signature": "s"}], "version": "1"}
    assert sdk_signing.canonical_card_payload(card) == (
        '{"name":"n","url":"http://a/","version":"1"}'), SDK_CHANGED


def test_the_sdk_payload_of_a_1_0_card_is_the_registered_payload():
    """For a card the SDK reads whole, its own canonical form is the registered one: the
    verifier relies on this to let the SDK check such cards end to end."""
    card = {
        "name": "Echo", "description": "echoes", "version": "1.0.0",
        "supportedInterfaces": [{"url": "http://127.0.0.1:9999/", "protocolBinding": "JSONRPC",
                                 "protocolVersion": "1.0"}],
        "capabilities": {"streaming": True}, "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": [{"id": "echo", "name": "Echo", "description": "echo", "tags": ["echo"]}],
    }
    proto = parse_agent_card(dict(card))
    assert sdk_signing.canonical_sdk_card_payload(proto) == (
        sdk_signing.canonical_card_payload(card)), SDK_CHANGED
