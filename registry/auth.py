"""DRF authentication: ``Authorization: Bearer <token>`` for API clients; staff sessions.

Tokens resolve through the process's one token cache (registry.token_cache), as on the
heartbeat fast path and the gateway: a revoked token stops working after the same delay.
"""

from __future__ import annotations

from rest_framework import authentication, exceptions, permissions

from registry.permissions import Actor, anonymous_actor, staff_actor
from registry.token_cache import AuthFailed, bearer_token, shared_token_cache

#: What every surface answers (with 401) to a request that carries no credentials.
UNAUTHENTICATED_MESSAGE = "authentication required: send Authorization: Bearer <token>"


__all__ = ["UNAUTHENTICATED_MESSAGE", "TokenAuthentication", "bearer_token", "request_actor"]


class TokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION")
        if not header:
            return None
        try:
            actor = shared_token_cache().actor_sync(header)
        except AuthFailed as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from None
        if actor is None:
            raise exceptions.AuthenticationFailed("invalid or revoked token")
        return (actor, bearer_token(header))

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'


def request_actor(request) -> Actor | None:
    """The actor of a DRF request: a token client, a staff user, anonymous (if on), or None."""
    user = getattr(request, "user", None)
    if isinstance(user, Actor):
        return user
    if user is not None and getattr(user, "is_authenticated", False) and user.is_staff:
        return staff_actor(user.get_username())
    return anonymous_actor()


class IsAuthenticatedOrAnonymousAllowed(permissions.BasePermission):
    message = UNAUTHENTICATED_MESSAGE

    def has_permission(self, request, view) -> bool:
        return request_actor(request) is not None
