"""The matcher: which agents fit the platform's needs. Hard constraints only (ranking per
request belongs to the router).

A need is a tag from the reviewed vocabulary, or a description in words (``text``), plus the
input and output modes the platform will use.

* **By tag**: a card satisfies the need when one skill carries the tag and that skill's modes
  -- or the card's default modes when the skill lists none -- contain every needed mode.
* **By text** ("describe what you need"): the cycle's cards offering the modes (a skill's, or
  the card's defaults) are ranked against the text by ARD's ranker, the one search uses (words
  and meaning fused, scores 0-100 with the best card of the cycle at 100; registered through
  :func:`registry.selectors.cards_ranked`, ard being beside discovery); the cards scoring at
  least ``DISCOVERY_NEED_TEXT_MIN_SCORE`` satisfy it, the better ones kept first under the cap.

A data/tenant policy hook (``settings.DISCOVERY_POLICY_HOOK``, a dotted path to
``hook(need, record, card) -> bool``) can exclude an agent per need. A need with
``require_signed`` matches only cards whose signature is valid (docs/signatures.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db.models import F
from django.utils.module_loading import import_string

from discovery.models import Need
from registry import selectors as registry_selectors
from registry.ids import DEFAULT_TENANT

if TYPE_CHECKING:
    from discovery.sources import EndpointRecord

logger = logging.getLogger(__name__)

# KubeMQ-style cards write bare modes; they mean the usual media types.
MODE_ALIASES = {"text": "text/plain", "json": "application/json"}
#: The score of a match by tag (exact) and of a configured static agent.
EXACT = 100


@dataclass(frozen=True)
class NeedSpec:
    tag: str  # "" for a need given as text
    input_modes: frozenset[str]
    output_modes: frozenset[str]
    description: str
    require_signed: bool = False
    text: str = ""


PolicyHook = Callable[[NeedSpec, "EndpointRecord", dict[str, Any]], bool]


def _norm(modes: Iterable[Any]) -> set[str]:
    return {MODE_ALIASES.get(m, m) for m in modes if isinstance(m, str)}


def needs_active(tenant: str = DEFAULT_TENANT) -> list[NeedSpec]:
    """``tenant``'s enabled needs: by tag (by tag name), then by text."""
    return [
        NeedSpec(
            tag=n.tag.name if n.tag is not None else "", text=n.text,
            input_modes=frozenset(_norm(n.input_modes)),
            output_modes=frozenset(_norm(n.output_modes)), description=n.description,
            require_signed=n.require_signed,
        )
        for n in Need.objects.filter(tenant_id=tenant, enabled=True).select_related("tag")
        .order_by(F("tag__name").asc(nulls_last=True), "text")
    ]


def _modes(skill_modes: Any, defaults: Any) -> set[str]:
    return _norm(skill_modes if isinstance(skill_modes, list) and skill_modes else defaults or [])


def _skill_fits(card: dict[str, Any], skill: dict[str, Any], need: NeedSpec) -> bool:
    return need.input_modes <= _modes(skill.get("inputModes"), card.get("defaultInputModes")) \
        and need.output_modes <= _modes(skill.get("outputModes"), card.get("defaultOutputModes"))


def satisfies(card: dict[str, Any], need: NeedSpec) -> bool:
    """Whether one skill of ``card`` carries the need's tag and accepts/emits its modes."""
    return any(
        isinstance(skill, dict) and need.tag in (skill.get("tags") or [])
        and _skill_fits(card, skill, need)
        for skill in card.get("skills") or []
    )


def offers_modes(card: dict[str, Any], need: NeedSpec) -> bool:
    """Whether ``card`` accepts/emits the need's modes: one of its skills does, or (a card
    without skills) its default modes do."""
    skills = [s for s in card.get("skills") or [] if isinstance(s, dict)]
    return any(_skill_fits(card, s, need) for s in skills) if skills \
        else _skill_fits(card, {}, need)


def text_matches(
    cards: Mapping[str, dict[str, Any]], needs: Iterable[NeedSpec], *, signed: set[str]
) -> dict[str, dict[NeedSpec, int]]:
    """``card key -> {need: score}`` for the needs given as text: per need, the ``cards``
    offering its modes (and signed, in ``signed``, when it asks) are ranked against its text;
    those scoring at least ``DISCOVERY_NEED_TEXT_MIN_SCORE`` match."""
    out: dict[str, dict[NeedSpec, int]] = {}
    floor = settings.DISCOVERY_NEED_TEXT_MIN_SCORE
    for need in needs:
        if not need.text:
            continue
        eligible = {
            key: card for key, card in cards.items()
            if (key in signed or not need.require_signed) and offers_modes(card, need)
        }
        ranked = registry_selectors.cards_ranked(text=need.text, cards=eligible) \
            if eligible else []
        if ranked is None:
            logger.warning("need %r is given as text but no ranking is installed (the ard "
                           "app): it matches nothing", need.text[:60])
            continue
        for key, score in ranked:
            if score >= floor:
                out.setdefault(key, {})[need] = score
    return out


def policy_hook() -> PolicyHook | None:
    path = getattr(settings, "DISCOVERY_POLICY_HOOK", None)
    return import_string(path) if path else None


def matched_needs(
    card: dict[str, Any], needs: Iterable[NeedSpec], *, record: EndpointRecord,
    hook: PolicyHook | None = None, signed: bool = False,
    text_scores: Mapping[NeedSpec, int] | None = None,
) -> list[tuple[NeedSpec, int]]:
    """The needs ``card`` satisfies and the policy hook allows, with the match's score
    (:data:`EXACT` by tag; by text, the ranker's from ``text_scores``, the card's entry of
    :func:`text_matches`), best first, then in the needs' order.

    ``signed``: the card's signature is valid (needs with ``require_signed`` ask for it).
    """
    scores = text_scores or {}
    found = []
    for n in needs:
        if n.text:
            score = scores.get(n)
            if score is None:
                continue
        elif (signed or not n.require_signed) and satisfies(card, n):
            score = EXACT
        else:
            continue
        if hook is None or hook(n, record, card):
            found.append((n, score))
    return sorted(found, key=lambda ns: -ns[1])
