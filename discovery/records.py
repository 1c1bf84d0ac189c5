"""What a discovery source proposes: :class:`EndpointRecord`, and :class:`SourceError` when a
source cannot be read. The ground of the package: the sources (:mod:`discovery.sources`), the
catalogs they read (:mod:`discovery.catalogs`) and the resolver that admits their records
(:mod:`discovery.resolver`) all build on it, one way."""

from __future__ import annotations

from dataclasses import dataclass, field

from discovery.names import agent_id_for

WELL_KNOWN_CARD_PATH = "/.well-known/agent-card.json"


@dataclass(frozen=True)
class EndpointRecord:
    """One proposed endpoint.

    ``configured`` records carry a reviewed local name and description; the others carry a
    derived name and get the description of the need they satisfy. ``inline_card`` is set when
    the source already holds the card bytes (this platform's registry), so nothing is fetched.
    """

    local_name: str
    base_url: str
    source: str
    configured: bool = False
    description: str = ""
    critical: bool = False
    agent_id: str | None = None
    inline_card: bytes | None = field(default=None, repr=False)
    inline_sha256: str | None = None

    @property
    def card_url(self) -> str:
        if self.inline_card is not None:
            return f"registry:{self.agent_id}"
        return card_url_for(self.base_url)

    @property
    def target_agent_id(self) -> str:
        return self.agent_id or agent_id_for(self.local_name)


class SourceError(Exception):
    """A source could not be read; the cycle goes on with the others."""


def card_url_for(base_url: str) -> str:
    """The card's URL under a base URL (RFC 8615 well-known path)."""
    return base_url.rstrip("/") + WELL_KNOWN_CARD_PATH
