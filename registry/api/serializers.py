"""Input and output shapes of the /api/v1 registry API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import ISO_8601, serializers
from rest_framework.settings import api_settings

from registry import selectors, visibility
from registry.auth import request_actor
from registry.models import Agent


class StrictInput(serializers.Serializer):
    """Refuses unknown fields instead of silently ignoring them."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["expected a JSON object"]})
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: ["unknown field"] for name in unknown})
        return super().to_internal_value(data)


class StrictInteger(serializers.IntegerField):
    """An integer that refuses strings, floats and booleans."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBoolean(serializers.BooleanField):
    """A JSON boolean: refuses strings and numbers."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class ParsedJSON(serializers.JSONField):
    """A member of a request body parsed from JSON (both API surfaces parse it so): JSON by
    construction, so DRF's check -- encoding the whole value again to see that it can be --
    is skipped; it cost a registration more than validating the rest (py-spy, 2-8 KiB
    cards)."""

    def to_internal_value(self, data):
        return data


@extend_schema_field({"type": "array", "maxItems": 100,
                      "items": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{1,39}$"}})
class TenantList(ParsedJSON):
    """Tenant slugs (``shared_with``), checked by the registry's services, whose refusal names
    the first bad one (a list field's per-item errors would be keyed by index)."""


class AgentRegisterInput(StrictInput):
    agent_id = serializers.CharField(max_length=200, trim_whitespace=False)
    url = serializers.CharField(max_length=2048, required=False, trim_whitespace=False)
    card = ParsedJSON(required=False)
    ttl_seconds = StrictInteger(required=False, min_value=1)
    max_concurrency = StrictInteger(required=False, min_value=1, max_value=100_000)
    credential_passthrough = StrictBoolean(required=False)
    public = StrictBoolean(required=False)  # listed to anonymous ARD discovery
    # docs/tenants.md: which other tenants see and call it.
    visibility = serializers.ChoiceField(choices=Agent.Visibility.choices, required=False)
    shared_with = TenantList(required=False)
    # null: the node's A2A_PUSH_RELAY (docs/push.md)
    push_relay = StrictBoolean(required=False, allow_null=True)

    def validate_card(self, value):
        if not isinstance(value, dict):
            raise serializers.ValidationError("card must be a JSON object")
        return value


class AgentUpdateInput(StrictInput):
    url = serializers.CharField(max_length=2048, required=False, trim_whitespace=False)
    card = serializers.JSONField(required=False)
    ttl_seconds = StrictInteger(required=False, min_value=1)
    max_concurrency = StrictInteger(required=False, min_value=1, max_value=100_000)
    credential_passthrough = StrictBoolean(required=False)
    public = StrictBoolean(required=False)
    visibility = serializers.ChoiceField(choices=Agent.Visibility.choices, required=False)
    shared_with = TenantList(required=False)
    # null: the node's A2A_PUSH_RELAY (docs/push.md)
    push_relay = StrictBoolean(required=False, allow_null=True)

    validate_card = AgentRegisterInput.validate_card


class AgentOutput(serializers.ModelSerializer):
    tags = serializers.ListField(child=serializers.CharField(), read_only=True)
    routable = serializers.BooleanField(source="is_routable", read_only=True)
    owner = serializers.SerializerMethodField()
    tenant = serializers.CharField(source="tenant_id", read_only=True)
    shared_with = serializers.SerializerMethodField(
        help_text="The tenants a 'shared' agent is shared with (shown to its tenant's admins "
        "and its owner; empty for other callers).")

    class Meta:
        model = Agent
        fields = [
            "agent_id", "name", "description", "url", "status", "routable", "source",
            "ttl_seconds", "max_concurrency", "registered_at", "last_seen", "expires_at",
            "node_id", "owner", "card_sha256", "card_signature", "tags", "card",
            "credential_passthrough", "public", "tenant", "visibility", "shared_with",
            "push_relay",
        ]

    def get_owner(self, agent: Agent) -> str | None:
        return _owner(agent)

    def get_shared_with(self, agent: Agent) -> list[str]:
        return _shared_with(agent)

    def to_representation(self, agent: Agent):
        data = super().to_representation(agent)
        request = self.context.get("request")
        if request is None or visibility.sees_internals(request_actor(request), agent):
            data["card"] = visibility.stored_card(agent)  # key order as registered
            return data
        # A caller, not the owner: the gateway's view of the agent, no internal address.
        base = visibility.base_url(request)
        data["url"] = visibility.gateway_url(base, agent.key)
        data["card"] = visibility.caller_card(agent, base)
        data["node_id"] = ""
        data["owner"] = None
        data["shared_with"] = []  # other tenants' names are its tenant's business
        return data


class AgentCallsOutput(serializers.Serializer):
    """An agent's calls through the gateway over the last ``window_minutes`` (all nodes)."""

    window_minutes = serializers.IntegerField()
    requests = serializers.IntegerField()
    agent_errors = serializers.IntegerField(
        help_text="Calls the agent answered with an error of its own -- a JSON-RPC error "
        "response (e.g. -32601, even at HTTP 200) or an HTTP error status -- relayed unchanged "
        "to the caller. Not gateway errors.")
    gateway_errors_executed = serializers.IntegerField(
        help_text="Gateway errors after the agent received the request (timeout, cut "
        "connection, ...).")
    gateway_errors_not_executed = serializers.IntegerField(
        help_text="Gateway errors before the agent received the request (safe to retry).")
    last_call_at = serializers.DateTimeField(allow_null=True)
    last_outcome = serializers.CharField(
        help_text="ok, agent_error, or the gateway's error kind; empty without calls.")


class AgentDetailOutput(AgentOutput):
    """``GET /api/v1/agents/{agent_id}``: the agent, and its recent calls through the gateway
    (``calls``: null for a caller who is not its owner or an admin, and where no statistics
    are kept)."""

    calls = serializers.SerializerMethodField()

    class Meta(AgentOutput.Meta):
        fields = [*AgentOutput.Meta.fields, "calls"]

    @extend_schema_field(AgentCallsOutput(allow_null=True))
    def get_calls(self, agent: Agent) -> dict | None:
        request = self.context.get("request")
        if request is not None and not visibility.sees_internals(request_actor(request), agent):
            return None
        calls = selectors.agent_calls(agent_id=agent.key)
        return None if calls is None else AgentCallsOutput(calls).data


def _shared_with(agent: Agent) -> list[str]:
    if agent.visibility != Agent.Visibility.SHARED or agent.pk is None:
        return []
    return sorted(agent.shared_with.values_list("slug", flat=True))


def _owner(agent: Agent) -> str | None:
    if agent.owner_id is None:
        return None
    known = getattr(agent, "_owner_client_id", None)  # set by a registration by its owner
    if known is not None:
        return known
    return agent.owner.client_id if agent.owner else None


_OWNER_FIELDS: list[tuple[str, Any, Callable[[Any], Any] | None]] | None = None


def owner_output(agent: Agent) -> dict:
    """``AgentOutput(agent).data`` with no request (the owner's view, as a registration
    answers), rendered by the serializer's own fields but without its per-field attribute
    machinery: ``get_attribute``'s lookups and checks cost more than the rendering (~200 µs of
    a registration's answer, cProfile), and the answer is built once per registration.
    ``tests/registry/test_owner_output.py`` holds it equal to the serializer's."""
    global _OWNER_FIELDS
    fields = _OWNER_FIELDS
    if fields is None:
        fields = _OWNER_FIELDS = [(name, field.source, None if _iso_datetime(field)
                                   else field.to_representation)
                                  for name, field in AgentOutput().fields.items()]
    tz = timezone.get_current_timezone()  # once, not once per date (a context-local lookup)
    out: dict = {}
    for name, source, render in fields:
        if name == "owner":
            out[name] = _owner(agent)
        elif name == "shared_with":
            out[name] = _shared_with(agent)
        elif name == "card":
            out[name] = visibility.stored_card(agent)  # key order as registered
        else:
            value = getattr(agent, source)
            if value is None:
                out[name] = None
            elif render is None:  # DateTimeField.to_representation, ISO 8601
                text = value.astimezone(tz).isoformat()
                out[name] = text[:-6] + "Z" if text.endswith("+00:00") else text
            else:
                out[name] = render(value)
    return out


def _iso_datetime(field: serializers.Field) -> bool:
    """Whether ``field`` renders an aware datetime as DRF's default: ISO 8601 in the current
    time zone, ``Z`` for UTC (no format or time zone of its own)."""
    return (isinstance(field, serializers.DateTimeField) and not hasattr(field, "format")
            and not hasattr(field, "timezone")
            and str(api_settings.DATETIME_FORMAT).lower() == ISO_8601)


class HeartbeatOutput(serializers.Serializer):
    agent_id = serializers.CharField()
    last_seen = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    ttl_seconds = serializers.IntegerField()
