"""Agent cards: the three accepted shapes, validation, endpoint resolution and hashing.

Shapes: A2A 0.3 (top-level ``url``, ``protocolVersion``, ``additionalInterfaces``), A2A 1.0
(``supportedInterfaces`` and no top-level ``url``) and KubeMQ-style (``agent_id`` in the card).
Validation is lenient by default (types of the known fields; a name and an endpoint are
required) and strict on request (the A2A schema, from the official ``a2a-sdk`` types).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from django.conf import settings

from registry.bindings import JSONRPC, grpc_only_endpoint, interface_binding
from registry.signatures import SignatureResult, policy, verify_card


class CardError(ValueError):
    """The card is not acceptable; the message says why."""


SHAPE_A2A_03 = "a2a-0.3"
SHAPE_A2A_10 = "a2a-1.0"
SHAPE_KUBEMQ = "kubemq"

_STR_FIELDS = ("name", "description", "version", "url", "protocolVersion", "preferredTransport",
               "documentationUrl", "iconUrl", "agent_id")
_STR_LIST_FIELDS = ("defaultInputModes", "defaultOutputModes", "protocolVersions")
_OBJ_FIELDS = ("capabilities", "provider", "securitySchemes")
_LIST_FIELDS = ("skills", "supportedInterfaces", "additionalInterfaces", "security",
                "signatures", "securityRequirements")


@dataclass(frozen=True)
class ParsedCard:
    """A validated card with what the registry indexes from it."""

    card: dict[str, Any]
    raw: bytes
    sha256: str
    shape: str
    name: str
    description: str
    endpoint: str | None
    skill_ids: list[str] = field(default_factory=list)
    skill_names: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    input_modes: list[str] = field(default_factory=list)
    output_modes: list[str] = field(default_factory=list)
    streaming: bool = False
    signature: SignatureResult | None = None  # None: not checked (A2A_CARD_SIGNATURES=off)


def card_sha256(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def card_shape(card: dict[str, Any]) -> str:
    if "agent_id" in card:
        return SHAPE_KUBEMQ
    if "supportedInterfaces" in card and "url" not in card:
        return SHAPE_A2A_10
    return SHAPE_A2A_03


def card_endpoint(card: dict[str, Any]) -> str | None:
    """The card's own JSON-RPC endpoint, where the gateway forwards calls.

    ``url`` when the card's main interface is JSON-RPC (``preferredTransport`` absent or
    ``JSONRPC``), else the first JSON-RPC entry of ``additionalInterfaces`` (0.3) or
    ``supportedInterfaces`` (1.0); for a card listing no JSON-RPC interface but a gRPC one
    (1.x first, else 0.3), that address as ``grpc://host:port`` (``grpcs://`` for TLS: the gateway
    translates JSON-RPC and HTTP+JSON calls to it); else ``url`` whatever it serves.
    """
    url = card.get("url")
    has_url = isinstance(url, str) and bool(url)
    if has_url and interface_binding(card.get("preferredTransport")) == JSONRPC:
        return url
    for key in ("additionalInterfaces", "supportedInterfaces"):
        for iface in card.get(key) or []:
            if not isinstance(iface, dict):
                continue
            binding = interface_binding(iface.get("protocolBinding") or iface.get("transport"))
            if binding == JSONRPC and isinstance(iface.get("url"), str) and iface["url"]:
                return iface["url"]
    grpc = grpc_only_endpoint(card)
    if grpc:
        return grpc
    return url if has_url else None


def _check_types(card: dict[str, Any]) -> None:
    for name in _STR_FIELDS:
        if name in card and not isinstance(card[name], str):
            raise CardError(f"card.{name} must be a string")
    for name in _STR_LIST_FIELDS:
        value = card.get(name)
        if value is not None and (
            not isinstance(value, list) or not all(isinstance(v, str) for v in value)
        ):
            raise CardError(f"card.{name} must be a list of strings")
    for name in _OBJ_FIELDS:
        if name in card and card[name] is not None and not isinstance(card[name], dict):
            raise CardError(f"card.{name} must be an object")
    for name in _LIST_FIELDS:
        if name in card and card[name] is not None and not isinstance(card[name], list):
            raise CardError(f"card.{name} must be a list")
    for i, skill in enumerate(card.get("skills") or []):
        if not isinstance(skill, dict):
            raise CardError(f"card.skills[{i}] must be an object")
        for key in ("id", "name", "description"):
            if key in skill and not isinstance(skill[key], str):
                raise CardError(f"card.skills[{i}].{key} must be a string")
        for key in ("tags", "inputModes", "outputModes", "examples"):
            value = skill.get(key)
            if value is not None and (
                not isinstance(value, list) or not all(isinstance(v, str) for v in value)
            ):
                raise CardError(f"card.skills[{i}].{key} must be a list of strings")
    for key in ("supportedInterfaces", "additionalInterfaces"):
        for i, iface in enumerate(card.get(key) or []):
            if not isinstance(iface, dict) or not isinstance(iface.get("url"), str):
                raise CardError(f"card.{key}[{i}] must be an object with a string url")
    caps = card.get("capabilities")
    if isinstance(caps, dict) and "streaming" in caps and not isinstance(caps["streaming"], bool):
        raise CardError("card.capabilities.streaming must be a boolean")


def _check_strict(card: dict[str, Any], shape: str) -> None:
    """Validate against the A2A schema using the official a2a-sdk types."""
    if shape == SHAPE_A2A_10:
        from a2a.types import AgentCard
        from google.protobuf.json_format import ParseDict, ParseError

        try:
            ParseDict(card, AgentCard(), ignore_unknown_fields=False)
        except ParseError as exc:
            raise CardError(f"card does not match the A2A 1.0 schema: {exc}") from None
        return
    from a2a.compat.v0_3.types import AgentCard as AgentCard03
    from pydantic import ValidationError

    body = {k: v for k, v in card.items() if k != "agent_id"} if shape == SHAPE_KUBEMQ else card
    try:
        AgentCard03.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise CardError(
            f"card does not match the A2A 0.3 schema: {where}: {first.get('msg')}"
        ) from None


def _dedupe(values: list[str]) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))


def parse_card(
    source: bytes | str | dict[str, Any], *, url: str | None = None, strict: bool | None = None
) -> ParsedCard:
    """Validate a card and index it. ``source`` is raw bytes (kept byte-exact) or a parsed dict.

    ``url`` is the registration's URL: it wins over the card's own endpoint. Raises
    :class:`CardError` with a message fit for an API client.
    """
    limit = settings.A2A_MAX_CARD_BYTES
    if isinstance(source, dict):
        card = source
        raw = orjson.dumps(card)
    else:
        raw = source.encode() if isinstance(source, str) else bytes(source)
        if len(raw) > limit:
            raise CardError(f"card is larger than {limit} bytes")
        try:
            card = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise CardError(f"card is not valid JSON: {exc}") from None
    if len(raw) > limit:
        raise CardError(f"card is larger than {limit} bytes")
    if not isinstance(card, dict):
        raise CardError("card must be a JSON object")
    if b"\\u0000" in (raw if isinstance(source, dict) else orjson.dumps(card)):
        # PostgreSQL cannot store NUL in text or JSON, and no card needs one.
        raise CardError("card must not contain NUL characters")
    _check_types(card)
    name = card.get("name")
    if not isinstance(name, str) or not name.strip():
        raise CardError("card.name is required")
    shape = card_shape(card)
    endpoint = url or card_endpoint(card)
    if not endpoint:
        raise CardError("an endpoint is required: a url, card.url, a JSONRPC or a GRPC "
                        "supportedInterface")
    if strict if strict is not None else settings.A2A_CARD_VALIDATION == "strict":
        _check_strict(card, shape)
    skills = [s for s in card.get("skills") or [] if isinstance(s, dict)]
    default_in = card.get("defaultInputModes") or []
    default_out = card.get("defaultOutputModes") or []
    caps = card.get("capabilities") if isinstance(card.get("capabilities"), dict) else {}
    return ParsedCard(
        card=card,
        raw=raw,
        sha256=card_sha256(raw),
        shape=shape,
        name=name.strip()[:200],
        description=str(card.get("description") or "")[:2000],
        endpoint=endpoint,
        skill_ids=_dedupe([s.get("id") or "" for s in skills]),
        skill_names=_dedupe([s.get("name") or "" for s in skills]),
        tags=_dedupe([t for s in skills for t in s.get("tags") or []]),
        input_modes=_dedupe(default_in + [m for s in skills for m in s.get("inputModes") or []]),
        output_modes=_dedupe(
            default_out + [m for s in skills for m in s.get("outputModes") or []]
        ),
        streaming=bool(caps.get("streaming")),  # type: ignore[union-attr]  # a dict (checked above)
    )


def card_signature_check(parsed: ParsedCard) -> ParsedCard:
    """The card with its signature result, per ``A2A_CARD_SIGNATURES``.

    ``off``: not checked. ``verify``: checked and recorded. ``require``: a card without a valid
    signature from a trusted key raises :class:`CardError` (docs/signatures.md).
    """
    mode = policy()
    if mode == "off":
        return parsed
    result = verify_card(parsed.card, sha256=parsed.sha256)
    if mode == "require" and not result.valid:
        why = f" ({result.detail})" if result.detail else ""
        raise CardError(
            f"card signature is {result.status.replace('_', ' ')}{why}: this registry requires "
            "cards signed by a trusted key (A2A_CARD_SIGNATURES=require)"
        )
    return replace(parsed, signature=result)
