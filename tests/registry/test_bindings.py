"""The card a caller sees through the gateway lists only interfaces the gateway answers.

Unit tests of :func:`registry.bindings.rewrite_card_endpoints` on the card shapes agents
publish; tests/gateway/test_card_bindings.py drives the served card with real SDK agents and
clients.
"""

from __future__ import annotations

import copy

from registry.bindings import (
    GRPC,
    HTTP_JSON,
    JSONRPC,
    gateway_bindings,
    grpc_only_endpoint,
    http_json_endpoint,
    interface_binding,
    rewrite_card_endpoints,
)
from tests.registry.cards import card_03, card_10, card_kubemq

GW = "http://gw.example/a2a/w-1/"
AGENT = "http://agent.example/"


def iface(binding: str, version: str, url: str = AGENT) -> dict:
    return {"url": url, "protocolBinding": binding, "protocolVersion": version}


def sdk_card(*interfaces: dict) -> dict:
    """A card as a2a-sdk 1.x renders it: ``supportedInterfaces`` plus the 0.3 view of the 0.x
    entries (first one main, the rest ``additionalInterfaces``)."""
    legacy = [i for i in interfaces if i["protocolVersion"].startswith("0.")]
    card = {"name": "All", "supportedInterfaces": list(interfaces), "version": "1"}
    if legacy:
        card.update({
            "url": legacy[0]["url"], "preferredTransport": legacy[0]["protocolBinding"],
            "protocolVersion": "0.3",
            "additionalInterfaces": [{"transport": i["protocolBinding"], "url": i["url"]}
                                     for i in legacy[1:]],
        })
    return card


def test_binding_names():
    assert interface_binding(None) == interface_binding("") == JSONRPC
    assert interface_binding("jsonrpc") == interface_binding("JSON-RPC") == JSONRPC
    assert interface_binding("HTTP+JSON") == interface_binding("rest") == HTTP_JSON
    assert interface_binding("grpc") == GRPC
    assert interface_binding("custom") == "CUSTOM" and interface_binding(5) == ""


def test_gateway_answers_json_rpc_and_http_json_for_every_agent():
    # HTTP+JSON forwarded to an agent whose card lists it, translated to the JSON-RPC of any other.
    for card in (card_10(), card_03(AGENT), card_kubemq()):
        assert gateway_bindings(card, GW) == {JSONRPC: {"url": GW}, HTTP_JSON: {"url": GW}}


def test_an_agent_without_http_json_gets_the_gateways_after_its_own_interfaces():
    out = rewrite_card_endpoints(sdk_card(iface(JSONRPC, "1.0"), iface(JSONRPC, "0.3")), GW)
    assert out["supportedInterfaces"] == [
        iface(JSONRPC, "1.0", GW), iface(JSONRPC, "0.3", GW), iface(HTTP_JSON, "1.0", GW),
        iface(HTTP_JSON, "0.3", GW)]
    assert (out["url"], out["preferredTransport"]) == (GW, JSONRPC)
    assert out["additionalInterfaces"] == [{"url": GW, "transport": HTTP_JSON}]
    kubemq = rewrite_card_endpoints(card_kubemq(), GW)
    assert (kubemq["url"], kubemq["additionalInterfaces"]) == (
        GW, [{"url": GW, "transport": HTTP_JSON}])
    unversioned = rewrite_card_endpoints(
        {"name": "x", "supportedInterfaces": [{"url": AGENT}]}, GW)
    assert unversioned["supportedInterfaces"] == [{"url": GW}, iface(HTTP_JSON, "1.0", GW)]


def test_http_json_endpoint_of_each_card_shape():
    assert http_json_endpoint(card_10()) == "http://127.0.0.1:9/rest"
    assert http_json_endpoint(card_03(AGENT)) == ""
    main = {**card_03(AGENT + "rest"), "preferredTransport": "HTTP+JSON"}
    assert http_json_endpoint(main) == AGENT + "rest"
    additional = {**card_03(AGENT), "additionalInterfaces": [
        {"url": AGENT + "g", "transport": "GRPC"}, {"url": AGENT + "r", "transport": "REST"}]}
    assert http_json_endpoint(additional) == AGENT + "r"
    # 0.3 fields first (the main interface, then additionalInterfaces), then 1.0 entries.
    both = {**additional, "supportedInterfaces": [iface(HTTP_JSON, "1.0", AGENT + "one")]}
    assert http_json_endpoint(both) == AGENT + "r"
    broken = {"name": "x", "supportedInterfaces": ["junk", {"protocolBinding": "HTTP+JSON"},
                                                   {"url": 5, "protocolBinding": "HTTP+JSON"}],
              "additionalInterfaces": "junk"}
    assert http_json_endpoint(broken) == ""


def test_all_three_bindings_grpc_first_keeps_json_rpc_and_http_json_in_the_agents_order():
    card = sdk_card(
        iface(GRPC, "1.0", "agent.example:50051"), iface(JSONRPC, "1.0"),
        iface(HTTP_JSON, "1.0", AGENT + "rest"),
        iface(GRPC, "0.3", "agent.example:50052"), iface(JSONRPC, "0.3"),
        iface(HTTP_JSON, "0.3", AGENT + "rest"),
    )
    original = copy.deepcopy(card)
    out = rewrite_card_endpoints(card, GW)
    assert out["supportedInterfaces"] == [
        iface(JSONRPC, "1.0", GW), iface(HTTP_JSON, "1.0", GW), iface(JSONRPC, "0.3", GW),
        iface(HTTP_JSON, "0.3", GW)]
    # The 0.3 view agrees: its main interface was gRPC, the gateway answers JSON-RPC first.
    assert (out["url"], out["preferredTransport"]) == (GW, JSONRPC)
    assert out["additionalInterfaces"] == [{"transport": JSONRPC, "url": GW},
                                           {"transport": HTTP_JSON, "url": GW}]
    assert out["protocolVersion"] == "0.3"
    assert list(out) == list(card)  # key order kept
    assert card == original  # the stored card is untouched


def test_one_entry_per_protocol_version_and_tenant():
    card = {"name": "x", "supportedInterfaces": [
        iface(JSONRPC, "1.0", AGENT + "a"), iface(JSONRPC, "1.0", AGENT + "b"),
        iface(JSONRPC, "0.3"), {**iface(JSONRPC, "1.0"), "tenant": "t2"}, "junk",
        {"url": AGENT},  # no binding: JSON-RPC
    ]}
    out = rewrite_card_endpoints(card, GW)
    assert out["supportedInterfaces"] == [
        iface(JSONRPC, "1.0", GW), iface(JSONRPC, "0.3", GW),
        {**iface(JSONRPC, "1.0", GW), "tenant": "t2"}, {"url": GW},
        iface(HTTP_JSON, "1.0", GW), iface(HTTP_JSON, "0.3", GW),  # the gateway's, translated
    ]
    assert "url" not in out and "preferredTransport" not in out  # a 1.0 card keeps its shape


def test_a_grpc_only_card_offers_jsonrpc_and_http_json_translated_to_its_grpc():
    card = {"name": "grpc only", "supportedInterfaces": [iface(GRPC, "1.0", "agent:1")]}
    assert grpc_only_endpoint(card) == "grpc://agent:1"
    assert rewrite_card_endpoints(card, GW)["supportedInterfaces"] == [
        iface(JSONRPC, "1.0", GW), iface(HTTP_JSON, "1.0", GW)]
    tls = {"name": "tls", "supportedInterfaces": [iface(GRPC, "1.0", "grpcs://agent:1")]}
    assert grpc_only_endpoint(tls) == "grpcs://agent:1"
    both = {"name": "both", "supportedInterfaces": [iface(GRPC, "1.0", "agent:1"),
                                                    iface(JSONRPC, "1.0", AGENT)]}
    assert grpc_only_endpoint(both) == ""
    # A 0.3 card whose one interface is gRPC: its 0.3 view names the gateway's JSON-RPC.
    grpc03 = {**card_03(), "preferredTransport": "GRPC", "url": "agent.example:50051"}
    assert grpc_only_endpoint(grpc03) == "grpc://agent.example:50051"
    out = rewrite_card_endpoints(grpc03, GW)
    assert (out["url"], out["preferredTransport"]) == (GW, JSONRPC)
    assert out["additionalInterfaces"] == [{"url": GW, "transport": HTTP_JSON}]


def test_a_card_without_a_served_interface_offers_none():
    rest = {"name": "rest only", "supportedInterfaces": [iface(HTTP_JSON, "1.0")]}
    assert rewrite_card_endpoints(rest, GW)["supportedInterfaces"] == [
        iface(HTTP_JSON, "1.0", GW)]


def test_03_card_main_binding_not_served_takes_the_first_served_additional():
    card = {**card_03(AGENT), "preferredTransport": "HTTP+JSON",
            "additionalInterfaces": [{"url": "agent.example:50051", "transport": "GRPC"},
                                     {"url": AGENT + "rpc", "transport": "JSONRPC"},
                                     {"url": AGENT + "rpc2", "transport": "JSONRPC"},
                                     {"url": AGENT + "rest", "transport": "HTTP+JSON"}]}
    out = rewrite_card_endpoints(card, GW)
    # The agent's main interface is HTTP+JSON, which the gateway answers for it.
    assert (out["url"], out["preferredTransport"]) == (GW, HTTP_JSON)
    assert out["additionalInterfaces"] == [{"url": GW, "transport": "JSONRPC"},
                                           {"url": GW, "transport": "HTTP+JSON"}]
    no_rest = {**card, "additionalInterfaces": card["additionalInterfaces"][:3]}
    assert http_json_endpoint(no_rest) == AGENT  # its main url, named HTTP+JSON


def test_03_and_kubemq_cards_point_at_the_gateway():
    out = rewrite_card_endpoints(card_03(AGENT), GW)
    assert (out["url"], out["preferredTransport"]) == (GW, JSONRPC)
    kubemq = card_kubemq()
    assert rewrite_card_endpoints(kubemq, GW)["url"] == GW
    del kubemq["url"]  # endpoint given at registration only
    assert rewrite_card_endpoints(kubemq, GW)["url"] == GW
    assert "preferredTransport" not in rewrite_card_endpoints(kubemq, GW)
