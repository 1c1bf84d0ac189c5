"""DRF authentication: ``Authorization: Bearer <token>`` for API clients; staff sessions."""

from __future__ import annotations

from rest_framework import authentication, exceptions, permissions

from registry.permissions import Actor, anonymous_actor, staff_actor
from registry.selectors import actor_from_token

#: What every surface answers (with 401) to a request that carries no credentials.
UNAUTHENTICATED_MESSAGE = "authentication required: send Authorization: Bearer <token>"


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` (or ``Api-Key <token>``) header."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() not in ("bearer", "api-key") or not token.strip():
        return None
    return token.strip()


class TokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION")
        if not header:
            return None
        token = bearer_token(header)
        if token is None:
            raise exceptions.AuthenticationFailed("Authorization must be 'Bearer <token>'")
        actor = actor_from_token(token=token)
        if actor is None:
            raise exceptions.AuthenticationFailed("invalid or revoked token")
        return (actor, token)

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
