"""Authentication before a gateway call's body is read, written once for every server.

A caller that does not authenticate is answered 401 without its body being read: the handler
checks it before reading a body above :data:`AUTH_FIRST_ABOVE_BYTES` (or chunked), and under
Daphne the server's adapter checks it before Twisted reads such a body at all
(``node.servers``). Both ask :func:`unauthenticated`. Smaller bodies arrive with their headers
anyway (one socket read), so small calls skip the extra step and are authenticated with the
rest of their admission.
"""

from __future__ import annotations

from registry.auth import UNAUTHENTICATED_MESSAGE
from registry.token_cache import AuthFailed, TokenCache

#: Bodies above this (or chunked) wait for authentication before they are read.
AUTH_FIRST_ABOVE_BYTES = 64 * 1024


async def unauthenticated(tokens: TokenCache, authorization: str | None) -> str | None:
    """Why a caller presenting ``authorization`` is not authenticated (the 401's detail), or
    None when it is. ``AuthUnavailable`` (the database down and the token never verified)
    propagates: the caller answers it as it answers an outage."""
    try:
        actor = await tokens.actor(authorization)
    except AuthFailed as exc:
        return str(exc)
    return None if actor is not None else UNAUTHENTICATED_MESSAGE
