"""DRF authentication: ``Authorization: Bearer <token>`` for API clients; staff sessions.

Tokens resolve through the process's one token cache (registry.token_cache), as on the
heartbeat fast path and the gateway: a revoked token stops working after the same delay.

Tokens are djangorestframework-api-key keys: ``<8-character prefix>.<32-character secret>``,
letters and digits (``PLATFORM_TOKEN_RE``). A header in any other shape is not one of this
platform's tokens: it costs no database lookup, and with anonymous access on it is ignored (the
caller is anonymous), as KubeMQ without gateway auth ignores credentials meant for someone
else -- except a JWT (three dot-separated parts) while trusted issuers are configured
(``A2A_JWT_ISSUERS``): it is verified through the same cache, and refused with its reason.
"""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions

from core import outage
from registry import identity
from registry.permissions import Actor, anonymous_actor
from registry.staff import user_actor
from registry.token_cache import (
    PLATFORM_TOKEN_RE,
    AuthFailed,
    bearer_token,
    is_platform_token,
    shared_token_cache,
)

#: What every surface answers (with 401) to a request that carries no credentials.
UNAUTHENTICATED_MESSAGE = "authentication required: send Authorization: Bearer <token>"

__all__ = [
    "PLATFORM_TOKEN_RE",
    "UNAUTHENTICATED_MESSAGE",
    "TokenAuthentication",
    "bearer_token",
    "is_platform_token",
    "request_actor",
]


class TokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION")
        if not header:
            return None
        token = bearer_token(header)
        if token is not None and not is_platform_token(token) and identity.looks_like_jwt(token):
            # A JWT from a trusted issuer: verified against the issuer's keys, no database.
            try:
                actor = shared_token_cache().actor_sync(header)
            except AuthFailed as exc:
                raise exceptions.AuthenticationFailed(str(exc)) from None
            return (actor, token)
        if not is_platform_token(token):
            if settings.A2A_ALLOW_ANONYMOUS:
                return None  # not ours: ignored, the caller is anonymous
            if token is None:
                raise exceptions.AuthenticationFailed("Authorization must be 'Bearer <token>'")
            raise exceptions.AuthenticationFailed("invalid or revoked token")
        if outage.breaker.is_open:
            # The database is known to be down: answer 503 now instead of waiting out the
            # pool timeout (requests queued for the sync thread while it tripped).
            raise outage.DatabaseUnavailable("database unavailable")
        try:
            actor = shared_token_cache().actor_sync(header)
        except AuthFailed as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from None
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
    staff = user_actor(user)
    if staff is not None:
        return staff
    return anonymous_actor()


class IsAuthenticatedOrAnonymousAllowed(permissions.BasePermission):
    message = UNAUTHENTICATED_MESSAGE

    def has_permission(self, request, view) -> bool:
        return request_actor(request) is not None


class TokenAuthenticationScheme(OpenApiAuthenticationExtension):
    """Documents :class:`TokenAuthentication` in the OpenAPI schema (HTTP bearer)."""

    target_class = "registry.auth.TokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API client's token (`manage.py create_client NAME --scopes ...`) "
            "or a JWT from an issuer trusted in `A2A_JWT_ISSUERS`.",
        }
