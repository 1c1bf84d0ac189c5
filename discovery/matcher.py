"""The matcher: which agents fit the platform's needs. Hard constraints only (ranking per
request belongs to the router).

A need is a tag from the reviewed vocabulary plus the input and output modes the platform will
use. A card satisfies it when one skill carries the tag and that skill's modes — or the card's
default modes when the skill lists none — contain every needed mode. A data/tenant policy hook
(``settings.DISCOVERY_POLICY_HOOK``, a dotted path to ``hook(need, record, card) -> bool``) can
exclude an agent per need. A need with ``require_signed`` matches only cards whose signature
is valid (docs/signatures.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.utils.module_loading import import_string

from discovery.models import Need

if TYPE_CHECKING:
    from discovery.sources import EndpointRecord

# KubeMQ-style cards write bare modes; they mean the usual media types.
MODE_ALIASES = {"text": "text/plain", "json": "application/json"}


@dataclass(frozen=True)
class NeedSpec:
    tag: str
    input_modes: frozenset[str]
    output_modes: frozenset[str]
    description: str
    require_signed: bool = False


PolicyHook = Callable[[NeedSpec, "EndpointRecord", dict[str, Any]], bool]


def _norm(modes: Iterable[Any]) -> set[str]:
    return {MODE_ALIASES.get(m, m) for m in modes if isinstance(m, str)}


def needs_active() -> list[NeedSpec]:
    """The enabled needs, by tag."""
    return [
        NeedSpec(
            tag=n.tag.name, input_modes=frozenset(_norm(n.input_modes)),
            output_modes=frozenset(_norm(n.output_modes)), description=n.description,
            require_signed=n.require_signed,
        )
        for n in Need.objects.filter(enabled=True).select_related("tag").order_by("tag__name")
    ]


def _modes(skill_modes: Any, defaults: Any) -> set[str]:
    return _norm(skill_modes if isinstance(skill_modes, list) and skill_modes else defaults or [])


def satisfies(card: dict[str, Any], need: NeedSpec) -> bool:
    """Whether one skill of ``card`` carries the need's tag and accepts/emits its modes."""
    for skill in card.get("skills") or []:
        if not isinstance(skill, dict) or need.tag not in (skill.get("tags") or []):
            continue
        if need.input_modes <= _modes(skill.get("inputModes"), card.get("defaultInputModes")) \
                and need.output_modes <= _modes(
                    skill.get("outputModes"), card.get("defaultOutputModes")):
            return True
    return False


def policy_hook() -> PolicyHook | None:
    path = getattr(settings, "DISCOVERY_POLICY_HOOK", None)
    return import_string(path) if path else None


def matched_needs(
    card: dict[str, Any], needs: Iterable[NeedSpec], *, record: EndpointRecord,
    hook: PolicyHook | None = None, signed: bool = False,
) -> list[NeedSpec]:
    """The needs ``card`` satisfies and the policy hook allows, in the needs' order.

    ``signed``: the card's signature is valid (needs with ``require_signed`` ask for it).
    """
    return [
        n for n in needs
        if (signed or not n.require_signed) and satisfies(card, n)
        and (hook is None or hook(n, record, card))
    ]
