"""Cards of a registration: resolving (fetched or given), applying to the row, recording
each version."""

from __future__ import annotations

from typing import Any

from core import tracing
from registry.bindings import http_json_endpoint
from registry.card_fetch import CardFetchError, fetch_card_bytes, names_a_card
from registry.cards import CardError, ParsedCard, card_signature_check, parse_card
from registry.models import Agent, CardVersion
from registry.netcheck import UnsafeUrl, check_agent_url
from registry.services.errors import InvalidInput


def _index(values: list[str]) -> str:
    return "|" + "|".join(v.replace("|", "") for v in values) + "|" if values else ""


def _resolve_card(
    *, url: str | None, card: dict[str, Any] | bytes | None, strict: bool | None
) -> ParsedCard:
    if url is not None:
        try:
            # A gRPC address (grpc://host:port) is an endpoint only with the card: none can be
            # fetched from it.
            url = check_agent_url(url, grpc=card is not None)
        except UnsafeUrl as exc:
            raise InvalidInput(f"url: {exc}") from None
    if card is None:
        if not url:
            raise InvalidInput("either a url or a card is required")
        try:
            with tracing.span("registry.card_fetch", **{"url.full": url}):
                card = fetch_card_bytes(url)
        except CardFetchError as exc:
            raise InvalidInput(str(exc)) from None
        if names_a_card(url):
            url = None  # the card's address, not the agent's: its endpoint is the card's own
    try:
        parsed = card_signature_check(parse_card(card, url=url, strict=strict))
    except CardError as exc:
        raise InvalidInput(str(exc)) from None
    if url is None:
        try:
            check_agent_url(parsed.endpoint, grpc=True)
        except UnsafeUrl as exc:
            raise InvalidInput(f"card endpoint: {exc}") from None
    rest = http_json_endpoint(parsed.card)
    if rest:
        # Without a lookup here (the registration's own URLs were resolved ahead of the
        # batch); every outbound connection checks the resolved address again.
        try:
            check_agent_url(rest, resolve=False)
        except UnsafeUrl as exc:
            raise InvalidInput(f"card HTTP+JSON interface: {exc}") from None
    return parsed


def _apply_card(agent: Agent, parsed: ParsedCard) -> None:
    agent.name = parsed.name
    agent.description = parsed.description
    agent.url = parsed.endpoint or ""
    agent.http_json_url = http_json_endpoint(parsed.card)[:2048]
    agent.card = parsed.card
    agent._card_parsed_from_raw = parsed.card  # type: ignore[attr-defined]  # its key order is card_raw's (stored_card)
    agent.card_raw = parsed.raw.decode("utf-8", errors="replace")
    agent.card_sha256 = parsed.sha256
    agent.card_shape = parsed.shape
    agent.card_signature = parsed.signature.status if parsed.signature else ""
    agent.tags_index = _index(parsed.tags)
    agent.skills_index = _index(parsed.skill_ids + parsed.skill_names)
    agent.input_modes_index = _index(parsed.input_modes)
    agent.output_modes_index = _index(parsed.output_modes)


def _record_card_version(agent: Agent, parsed: ParsedCard, *, new_agent: bool = False,
                         unchanged: bool = False) -> None:
    """Keep ``parsed`` in the agent's card history. ``new_agent``: the row was inserted in
    this transaction (no history yet: one INSERT). ``unchanged``: the agent already had these
    card bytes with this signature verdict, so their version is recorded as it is."""
    sig = parsed.signature
    if unchanged:
        return  # a renewal with the same card and verdict: nothing new to record
    fields = _version_fields(agent, parsed)
    if new_agent:
        CardVersion.objects.create(agent=agent, sha256=parsed.sha256, **fields)
        return
    version, created = CardVersion.objects.get_or_create(
        agent=agent, sha256=parsed.sha256, defaults=fields,
    )
    if not created and sig is not None and version.signature_status != sig.status:
        # Same bytes, new verdict (a key rotated in or out): the history shows the latest.
        CardVersion.objects.filter(pk=version.pk).update(
            **{k: v for k, v in fields.items() if k.startswith("signature_")})


def _version_fields(agent: Agent, parsed: ParsedCard) -> dict[str, Any]:
    sig = parsed.signature
    return {
        "card_raw": agent.card_raw,
        "endpoint": agent.url,
        "skill_ids": parsed.skill_ids,
        "signature_status": sig.status if sig else "",
        "signature_kid": sig.kid[:200] if sig else "",
        "signature_detail": sig.detail[:300] if sig else "",
    }
