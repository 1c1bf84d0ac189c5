"""Card shapes, endpoint resolution, lenient and strict validation."""

import pytest

from registry.cards import (
    SHAPE_A2A_03,
    SHAPE_A2A_10,
    SHAPE_KUBEMQ,
    CardError,
    parse_card,
)
from tests.registry.cards import card_03, card_10, card_kubemq


def test_shapes_and_endpoints():
    p03 = parse_card(card_03("http://a.example/"))
    assert (p03.shape, p03.endpoint) == (SHAPE_A2A_03, "http://a.example/")
    p10 = parse_card(card_10("http://b.example/a2a"))
    assert (p10.shape, p10.endpoint) == (SHAPE_A2A_10, "http://b.example/a2a")
    pk = parse_card(card_kubemq(url="http://c.example/"))
    assert (pk.shape, pk.endpoint) == (SHAPE_KUBEMQ, "http://c.example/")


def test_registration_url_wins_over_card():
    assert parse_card(card_03("http://card.example/"), url="http://reg.example/").endpoint == (
        "http://reg.example/"
    )


def test_index_fields():
    parsed = parse_card(card_10())
    assert parsed.tags == ["warranty"]
    assert parsed.skill_ids == ["claims"]
    assert "image/png" in parsed.input_modes and "text/plain" in parsed.input_modes
    assert parsed.output_modes == ["application/json"]
    assert parsed.streaming is True


def test_raw_bytes_kept_exactly():
    raw = (
        b'{ "name" : "X",\n  "url": "http://x.example/", '
        b'"signatures": [{"protected": "e30", "signature": "abc"}] }'
    )
    parsed = parse_card(raw)
    assert parsed.raw == raw


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c.pop("name"), "card.name is required"),
        (lambda c: c.update(name=""), "card.name is required"),
        (lambda c: c.update(name=5), "card.name must be a string"),
        (lambda c: c.pop("url"), "an endpoint is required"),
        (lambda c: c.update(skills="x"), "card.skills must be a list"),
        (lambda c: c.update(skills=[{"tags": "x"}]), "card.skills[0].tags"),
        (lambda c: c.update(defaultInputModes=[1]), "card.defaultInputModes"),
        (lambda c: c.update(capabilities=[]), "card.capabilities must be an object"),
    ],
)
def test_lenient_validation_errors(mutate, message):
    card = card_03()
    mutate(card)
    with pytest.raises(CardError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_card(card)


def test_not_json_and_not_object_and_too_big(settings):
    with pytest.raises(CardError, match="not valid JSON"):
        parse_card(b"{nope")
    with pytest.raises(CardError, match="must be a JSON object"):
        parse_card(b"[1, 2]")
    settings.A2A_MAX_CARD_BYTES = 1024
    big = card_03()
    big["description"] = "x" * 2000
    with pytest.raises(CardError, match="larger than 1024 bytes"):
        parse_card(big)


def test_strict_validation_uses_the_a2a_schema():
    parse_card(card_03(), strict=True)
    parse_card(card_10(), strict=True)
    bad = card_10()
    bad["capabilities"] = {"streaming": True, "noSuchCapability": 1}
    parse_card(bad, strict=False)  # lenient: unknown fields pass
    with pytest.raises(CardError, match="A2A 1.0 schema"):
        parse_card(bad, strict=True)
    bad03 = card_03()
    del bad03["skills"][0]["id"]
    with pytest.raises(CardError, match="A2A 0.3 schema"):
        parse_card(bad03, strict=True)


def test_nul_characters_refused():
    card = card_03()
    card["description"] = "bad\x00byte"
    with pytest.raises(CardError, match="NUL"):
        parse_card(card)
    with pytest.raises(CardError, match="NUL"):
        parse_card(b'{"name": "x\\u0000", "url": "http://a.example/"}')


def test_endpoint_is_the_cards_json_rpc_interface():
    """The gateway forwards JSON-RPC: a card whose main interface is another binding gives the
    URL of its JSON-RPC interface; a card without one its 1.x gRPC interface, else ``url``."""
    grpc_main = {**card_03("http://a.example/grpc"), "preferredTransport": "GRPC",
                 "additionalInterfaces": [
                     {"url": "http://a.example/rest", "transport": "HTTP+JSON"},
                     {"url": "http://a.example/rpc", "transport": "JSONRPC"}]}
    assert parse_card(grpc_main).endpoint == "http://a.example/rpc"
    both = {**grpc_main, "additionalInterfaces": [], "supportedInterfaces": [
        {"url": "a.example:50051", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
        {"url": "http://a.example/v1", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}]}
    assert parse_card(both).endpoint == "http://a.example/v1"
    del both["supportedInterfaces"][1]
    # No JSON-RPC interface at all: its 1.x gRPC one (calls are translated to it) ...
    assert parse_card(both).endpoint == "grpc://a.example:50051"
    del both["supportedInterfaces"][0]
    # ... else its 0.3 one (the main interface here: ``http://`` names no TLS) ...
    assert parse_card(both).endpoint == "grpc://a.example/grpc"
    rest_main = {**card_03("http://a.example/rest"), "preferredTransport": "HTTP+JSON"}
    assert parse_card(rest_main).endpoint == "http://a.example/rest"  # ... else ``url``
    assert parse_card(card_03("http://a.example/")).endpoint == "http://a.example/"
    assert parse_card(grpc_main, url="http://reg.example/").endpoint == "http://reg.example/"
