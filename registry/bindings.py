"""Protocol bindings in agent cards, and the card a caller sees through the gateway.

A2A 1.0 defines three standard protocol bindings: JSON-RPC (``JSONRPC``), HTTP+JSON
(``HTTP+JSON``) and gRPC (``GRPC``). A card lists the agent's interfaces twice over:

* A2A 1.0: ``supportedInterfaces[{url, protocolBinding, protocolVersion, tenant?}]``, in the
  agent's order of preference (one entry per binding and protocol version);
* A2A 0.3: ``url`` + ``preferredTransport`` (the main interface; JSON-RPC when absent) and
  ``additionalInterfaces[{url, transport}]``. The SDKs render both for an agent that speaks 0.3
  too, and a KubeMQ-style card has only ``url`` (JSON-RPC).

SDK clients take the first interface in the card whose binding they support (or their own first
preference the card offers), so a card served through the gateway must list **only interfaces
the gateway answers for that agent**, each at the address where it answers; an interface the
gateway does not serve, left in the card, sends a client to a 404 (or to a gRPC port that is not
there) although another binding would have worked. :func:`gateway_bindings` is the one place
that decides which bindings the gateway answers for an agent and where; every rewritten card
(the gateway's well-known card path, the API's caller view, the KubeMQ surface's listing,
session pins' tree cards) goes through :func:`rewrite_card_endpoints`, which applies it to both
views of the card: entries of other bindings are dropped, the agent's order is kept, and
``url``/``preferredTransport``/``additionalInterfaces`` agree with what is left.
"""

from __future__ import annotations

from typing import Any

JSONRPC = "JSONRPC"
HTTP_JSON = "HTTP+JSON"
GRPC = "GRPC"

_NAMES = {"JSONRPC": JSONRPC, "JSON-RPC": JSONRPC, "HTTP+JSON": HTTP_JSON, "HTTP_JSON": HTTP_JSON,
          "REST": HTTP_JSON, "GRPC": GRPC}


def interface_binding(value: object) -> str:
    """The binding a ``protocolBinding`` / ``transport`` / ``preferredTransport`` value names.

    Absent (``None`` or empty): JSON-RPC, the default of every A2A version. A name outside the
    three standard bindings is answered upper-cased (a custom binding); a value that is not a
    string names no binding at all (``""``).
    """
    if value is None:
        return JSONRPC
    if not isinstance(value, str):
        return ""
    name = value.strip().upper()
    if not name:
        return JSONRPC
    return _NAMES.get(name, name)


def http_json_endpoint(card: dict[str, Any]) -> str:
    """The card's own HTTP+JSON (REST) interface URL, where the gateway forwards the A2A
    HTTP+JSON binding's calls; ``""`` when the card lists none.

    ``url`` when the card's main interface is HTTP+JSON (``preferredTransport``), else the first
    HTTP+JSON entry of ``additionalInterfaces`` (0.3), then of ``supportedInterfaces`` (1.0). An
    SDK agent serves both protocol versions from one base (1.0 routes at the base, 0.3 under
    ``/v1/``), so an agent has one such URL. The registry stores it with the agent
    (``Agent.http_json_url``) and routing tables carry it, so the gateway never reads a card
    on a call.
    """
    return _first_url(card, HTTP_JSON)


def _first_url(card: dict[str, Any], binding: str) -> str:
    """The card's first URL of ``binding``: its main ``url`` when ``preferredTransport`` is
    that binding, else the first such entry of ``additionalInterfaces`` (0.3), then of
    ``supportedInterfaces`` (1.0); ``""`` when it lists none."""
    url = card.get("url")
    if isinstance(url, str) and url and \
            interface_binding(card.get("preferredTransport")) == binding:
        return url
    for key in ("additionalInterfaces", "supportedInterfaces"):
        entries = card.get(key)
        for iface in entries if isinstance(entries, list) else []:
            if isinstance(iface, dict) and interface_binding(
                    iface.get("protocolBinding") or iface.get("transport")) == binding \
                    and isinstance(iface.get("url"), str) and iface["url"]:
                return str(iface["url"])
    return ""


def _major(version: object) -> int | None:
    """The major number of a ``protocolVersion`` (``"1.0"`` -> 1, ``"0.3.0"`` -> 0)."""
    if not isinstance(version, str):
        return None
    head = version.strip().split(".", 1)[0]
    return int(head) if head.isdigit() else None


def jsonrpc_version(card: dict[str, Any], endpoint: str) -> str:
    """The A2A version the agent's JSON-RPC endpoint (``endpoint``, where the gateway sends
    calls) speaks, as the gateway translates other bindings' calls to it: ``"1.0"`` when the
    card lists a JSON-RPC interface of version 1.x at that URL (or lists one and no 0.3 view at
    all, a pure 1.0 card), else ``"0.3"`` (0.3 and KubeMQ-style cards; an SDK agent listing
    both versions at one URL answers both)."""
    entries = card.get("supportedInterfaces")
    newer = [iface for iface in entries if isinstance(iface, dict)
             and interface_binding(iface.get("protocolBinding")) == JSONRPC
             and (_major(iface.get("protocolVersion")) or 0) >= 1] \
        if isinstance(entries, list) else []
    if any(iface.get("url") == endpoint for iface in newer):
        return "1.0"
    if newer and "url" not in card and not card.get("additionalInterfaces"):
        return "1.0"
    return "0.3"


def grpc_endpoint(card: dict[str, Any], version: str) -> str:
    """The card's own gRPC interface (``host:port``) of protocol ``version`` (``"1.0"``: any
    1.x, ``"0.3"``: any 0.x), ``""`` when it lists none: 1.0 entries of ``supportedInterfaces``
    name their version; a 0.3 card's ``url`` (``preferredTransport: GRPC``) and
    ``additionalInterfaces`` entries are 0.3."""
    major = _major(version)
    entries = card.get("supportedInterfaces")
    for iface in entries if isinstance(entries, list) else []:
        if isinstance(iface, dict) and interface_binding(iface.get("protocolBinding")) == GRPC \
                and _major(iface.get("protocolVersion") or "1.0") == major \
                and isinstance(iface.get("url"), str) and iface["url"]:
            return iface["url"]
    if major != 0:
        return ""
    url = card.get("url")
    if isinstance(url, str) and url and interface_binding(card.get("preferredTransport")) == GRPC:
        return url
    additional = card.get("additionalInterfaces")
    for iface in additional if isinstance(additional, list) else []:
        if isinstance(iface, dict) and interface_binding(iface.get("transport")) == GRPC \
                and isinstance(iface.get("url"), str) and iface["url"]:
            return iface["url"]
    return ""


def grpc_tenant(card: dict[str, Any]) -> str:
    """The ``tenant`` of the card's own first 1.x gRPC interface (A2A 1.0: an agent hosting
    several tenants names the one its card is for), ``""`` when it names none."""
    entries = card.get("supportedInterfaces")
    for iface in entries if isinstance(entries, list) else []:
        if isinstance(iface, dict) and interface_binding(iface.get("protocolBinding")) == GRPC \
                and _major(iface.get("protocolVersion") or "1.0") == 1 \
                and isinstance(iface.get("url"), str) and iface["url"]:
            tenant = iface.get("tenant")
            return tenant if isinstance(tenant, str) else ""
    return ""


def lists_jsonrpc(card: dict[str, Any]) -> bool:
    """Whether the card lists a JSON-RPC interface (its main ``url`` without another
    ``preferredTransport``, or an entry of either interface list)."""
    return bool(_first_url(card, JSONRPC))


def grpc_url(address: str) -> str:
    """The endpoint URL of a card's gRPC interface address: ``grpc://host:port``
    (``grpcs://`` for a ``grpcs://`` or ``https://`` address: TLS)."""
    text = address.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        return f"grpc://{text}"
    return f"{'grpcs' if scheme.lower() in ('grpcs', 'https') else 'grpc'}://{rest}"


def grpc_only_endpoint(card: dict[str, Any]) -> str:
    """For a card that lists no JSON-RPC interface but a gRPC one: that interface (its 1.x
    one, else its 0.3 one) as the agent's endpoint (:func:`grpc_url`), where the gateway calls
    it (JSON-RPC and HTTP+JSON calls translated to gRPC); ``""`` for any other card."""
    if lists_jsonrpc(card):
        return ""
    address = grpc_endpoint(card, "1.0") or grpc_endpoint(card, "0.3")
    return grpc_url(address) if address else ""


def is_grpc_url(endpoint: str) -> bool:
    """Whether an agent's endpoint is a gRPC address (:func:`grpc_only_endpoint`)."""
    return endpoint.startswith(("grpc://", "grpcs://"))


def gateway_bindings(card: dict[str, Any], gateway_url: str) -> dict[str, dict[str, str]]:
    """The bindings the gateway answers for the agent of ``card``, each with the interface
    fields (``url``) that say where it answers.

    The gateway answers A2A JSON-RPC at ``gateway_url`` (``/a2a/{agent_id}/``) for every agent,
    whatever protocol version the agent speaks (1.0 and 0.3 method names are forwarded alike),
    and the HTTP+JSON binding at the same base (1.0 routes, 0.3 routes under ``/v1/``) for every
    agent too: forwarded to the agent's own HTTP+JSON interface when its card lists one
    (:func:`http_json_endpoint`), else translated to its JSON-RPC -- or, for an agent whose
    card lists only a gRPC interface (:func:`grpc_only_endpoint`), both translated to gRPC.
    (gRPC: while the node's listener runs, :func:`gateway_grpc_interface`.)
    """
    return {JSONRPC: {"url": gateway_url}, HTTP_JSON: {"url": gateway_url}}


def _served(entries: list[Any], served: dict[str, dict[str, str]], *, binding_key: str,
            versioned: bool) -> list[dict[str, Any]]:
    """``entries`` (interfaces) of a served binding, pointed at the gateway, in their order.

    After the rewrite two entries of one binding (and, for 1.0 entries, one protocol version and
    tenant) would be the same interface: the first is kept.
    """
    out: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        binding = interface_binding(entry.get(binding_key, entry.get("transport")))
        fields = served.get(binding)
        if fields is None or (binding == GRPC and (
                not versioned or _major(entry.get("protocolVersion") or "1.0") != 1)):
            continue  # the gateway's gRPC interface is reachable by its 1.0 tenant only
        entry = {**entry, **fields}
        key = (binding, entry.get("protocolVersion"), entry.get("tenant")) if versioned else (
            binding,)
        if key in seen:
            continue
        seen.add(key)
        out.append(entry)
    return out


def gateway_grpc_interface(gateway_url: str) -> dict[str, str] | None:
    """The gateway's gRPC interface for the agent of ``gateway_url`` (``.../a2a/{agent_id}/``):
    ``host:port`` of this node's gRPC listener (``A2A_GRPC_PUBLIC_ADDRESS``, else the gateway
    URL's host with the listener's port) and ``tenant`` the agent id (``{tenant}.{agent_id}``
    outside the default tenant: docs/tenants.md), as A2A 1.0 intends for
    hosts serving several agents; None while no listener runs."""
    from urllib.parse import urlsplit

    from django.conf import settings

    from core import lifecycle as node
    from registry.ids import key_of_gateway_path

    port = node.grpc_port()
    if port is None:
        return None
    parts = urlsplit(gateway_url)
    agent_id = key_of_gateway_path(parts.path)  # a qualified id in another tenant
    address = settings.A2A_GRPC_PUBLIC_ADDRESS
    if not address:
        host = parts.hostname or "localhost"
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return {"url": address, "tenant": agent_id}


def _with_grpc(out: dict[str, Any], grpc: dict[str, str]) -> dict[str, Any]:
    """``out`` (a rewritten card) offering the gateway's gRPC interface: the agent's own 1.x
    gRPC entries were rewritten in place (its order); without one, it comes last (the agent's
    own bindings first: gRPC reaches the agent through translation). A card without
    ``supportedInterfaces`` (0.3, KubeMQ-style) gets them as SDK clients read its 0.3 view,
    then the gRPC one: its 0.3 view cannot carry a tenant."""
    interfaces = out.get("supportedInterfaces")
    if not isinstance(interfaces, list):
        if "url" not in out:
            return out
        version = out.get("protocolVersion") or "0.3.0"
        additional = out.get("additionalInterfaces")
        interfaces = [{"url": out["url"], "protocolBinding": out.get("preferredTransport")
                       or JSONRPC, "protocolVersion": version}] + [
            {"url": iface.get("url"), "protocolBinding": iface.get("transport"),
             "protocolVersion": version}
            for iface in (additional if isinstance(additional, list) else [])
            if isinstance(iface, dict)]
    if not any(isinstance(i, dict) and interface_binding(i.get("protocolBinding")) == GRPC
               for i in interfaces):
        interfaces = [*interfaces, {"url": grpc["url"], "protocolBinding": GRPC,
                                    "protocolVersion": "1.0", "tenant": grpc["tenant"]}]
    return {**out, "supportedInterfaces": interfaces}


def rewrite_card_endpoints(card: dict[str, Any], gateway_url: str) -> dict[str, Any]:
    """A copy of ``card`` listing only the interfaces the gateway answers, at the gateway.

    ``supportedInterfaces`` (1.0) keeps the agent's entries of the bindings
    :func:`gateway_bindings` answers, in the agent's order, one per binding, protocol version and
    tenant. The 0.3 view keeps ``additionalInterfaces`` entries the same way (one per binding);
    ``url`` and ``preferredTransport`` name the agent's main interface when the gateway answers
    its binding, else the first served ``additionalInterfaces`` entry, and are dropped when the
    gateway answers none (the card then offers no 0.3 interface). A card with neither ``url``
    nor ``supportedInterfaces`` (KubeMQ-style, endpoint given at registration) gets the gateway's
    JSON-RPC ``url``. An agent listing no HTTP+JSON interface gets the gateway's (translated)
    after its own interfaces, in each view (:func:`_with_http_json`; the 0.3 view an
    ``additionalInterfaces`` entry). While the node's gRPC listener runs, every card offers it too
    (:func:`gateway_grpc_interface`, :func:`_with_grpc`). Everything else, key order included,
    is left as it is.
    """
    served = gateway_bindings(card, gateway_url)
    grpc = gateway_grpc_interface(gateway_url)
    out = dict(card)
    interfaces = card.get("supportedInterfaces")
    if isinstance(interfaces, list):
        entries = _served(interfaces, {**served, GRPC: grpc} if grpc else served,
                          binding_key="protocolBinding", versioned=True)
        if grpc_only_endpoint(card):
            # A gRPC-only agent: JSON-RPC at the gateway (translated to its gRPC) after its
            # own gRPC interface, its preference; HTTP+JSON follows (_with_http_json).
            entries = [*entries, {**served[JSONRPC], "protocolBinding": JSONRPC,
                                  "protocolVersion": "1.0"}]
        out["supportedInterfaces"] = _with_http_json(entries, served[HTTP_JSON], card)
    out = _rewrite_03(card, out, served)
    return _with_grpc(out, grpc) if grpc else out


def _with_http_json(interfaces: list[dict[str, Any]], fields: dict[str, str],
                    card: dict[str, Any]) -> list[dict[str, Any]]:
    """``interfaces`` (served 1.0 entries) offering HTTP+JSON: an agent without its own gets
    the gateway's (translated to its JSON-RPC) after its own entries, one per protocol version
    of its JSON-RPC entries (1.0 when they name none), so its preference stays first. An agent
    with its own keeps its entries as they are (its calls are forwarded there), and so does a
    card listing no JSON-RPC interface (nothing to translate to)."""
    jsonrpc = [i for i in interfaces if interface_binding(i.get("protocolBinding")) == JSONRPC]
    if http_json_endpoint(card) or not jsonrpc:
        return interfaces  # translation needs the agent's JSON-RPC
    versions = [v for v in (i.get("protocolVersion") for i in jsonrpc)
                if isinstance(v, str) and v] or ["1.0"]
    added = [{**fields, "protocolBinding": HTTP_JSON, "protocolVersion": version}
             for version in dict.fromkeys(versions)]
    return [*interfaces, *added]


def _rewrite_03(card: dict[str, Any], out: dict[str, Any],
                served: dict[str, dict[str, str]]) -> dict[str, Any]:
    """The 0.3 view of :func:`rewrite_card_endpoints` (``out`` has the 1.0 one)."""
    additional = card.get("additionalInterfaces")
    kept = []
    if isinstance(additional, list):
        kept = out["additionalInterfaces"] = _served(additional, served, binding_key="transport",
                                                     versioned=False)
    if "url" not in card and "supportedInterfaces" in card:
        return out  # a 1.0 card: no 0.3 main interface to rewrite
    main = interface_binding(card.get("preferredTransport"))
    if main not in served:
        main = interface_binding(kept[0].get("transport")) if kept else ""
    if main not in served and grpc_only_endpoint(card):
        main = JSONRPC  # the gateway's JSON-RPC, translated to the agent's gRPC
    if main not in served:
        out.pop("url", None)
        out.pop("preferredTransport", None)
        return out
    out["url"] = served[main]["url"]
    if "preferredTransport" in card or main != JSONRPC:
        out["preferredTransport"] = main
    if not http_json_endpoint(card) and (main == JSONRPC or any(
            interface_binding(i.get("transport")) == JSONRPC for i in kept)):
        # The gateway's HTTP+JSON (translated to its JSON-RPC) after the agent's interfaces.
        out["additionalInterfaces"] = [*kept, {**served[HTTP_JSON], "transport": HTTP_JSON}]
    return out
