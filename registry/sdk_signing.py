"""The a2a-sdk's private card-signing helpers, behind one module.

A card signature covers the card's canonical form: the card without ``signatures``, empty
strings, lists and objects removed, serialised by JCS (RFC 8785). The a2a-sdk's signer and
verifier compute that form with helpers that are not part of its public API
(``a2a.utils._jcs.canonicalize``, ``a2a.utils.signing._clean_empty`` and
``_canonicalize_agent_card``), so any SDK release may rename or change them. This module is the
only place that imports them; ``tests/registry/test_sdk_signing.py`` pins what they return on
known inputs and fails, naming this module, when an SDK upgrade changes them: a silent change
would make every signed card verify as invalid, or worse, accept a payload the signer never
covered.
"""

from __future__ import annotations

from typing import Any

from a2a.utils._jcs import canonicalize as _jcs_canonicalize
from a2a.utils.signing import _canonicalize_agent_card, _clean_empty

__all__ = ["canonical_card_payload", "canonical_sdk_card_payload", "canonicalize", "clean_empty"]


def canonicalize(value: Any) -> str:
    """RFC 8785 (JCS) serialisation of a JSON value, as the SDK's signer writes it."""
    return _jcs_canonicalize(value)


def clean_empty(value: Any) -> Any:
    """``value`` with empty strings, lists and objects removed, recursively (None when nothing
    is left); nesting deeper than the SDK's bound raises ``ValueError``."""
    return _clean_empty(value)


def canonical_card_payload(card: dict[str, Any]) -> str:
    """The signed payload of ``card`` taken as registered (a JSON object, any A2A version)."""
    body = {key: value for key, value in card.items() if key != "signatures"}
    return canonicalize(clean_empty(body) or {})


def canonical_sdk_card_payload(agent_card: Any) -> str:
    """The signed payload the SDK derives from its own ``AgentCard`` message."""
    return _canonicalize_agent_card(agent_card)
