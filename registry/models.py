"""Registry models: tenants, agents, their card history, API clients and nodes."""

from __future__ import annotations

from typing import Any

import orjson
from django.db import models
from django.db.models import Q
from django.utils import timezone
from rest_framework_api_key.models import AbstractAPIKey

from registry.ids import DEFAULT_TENANT, agent_key


class Tenant(models.Model):
    """An isolated namespace of agents, clients and records (docs/tenants.md). Its slug is
    its key: rows refer to it by the slug itself, so a tenant's routing key needs no join."""

    slug = models.SlugField(max_length=40, primary_key=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)
    # Quotas (registry.quotas; empty: no limit of the tenant's own).
    max_agents = models.PositiveIntegerField(
        null=True, blank=True, help_text="Agents the tenant may have (empty: no limit).")
    max_card_bytes = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="The largest card its agents may register (empty: A2A's own cap only).")
    max_registrations_per_minute = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="Registrations and re-registrations per minute, every surface (empty: no "
                  "limit).")
    max_calls_per_second = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="Gateway calls per second to its agents, every binding (empty: no limit).")
    max_concurrent_streams = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="Streams open at once to its agents (empty: no limit).")

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


def tenant_field(related_name: str) -> models.ForeignKey:
    """The tenant a row belongs to (default: the default tenant). PROTECT: a tenant with rows
    cannot be deleted by accident."""
    return models.ForeignKey(
        "registry.Tenant", on_delete=models.PROTECT, default=DEFAULT_TENANT,
        related_name=related_name, db_index=True,
    )


class AgentQuerySet(models.QuerySet):
    def routable(self) -> AgentQuerySet:
        """Active and within their TTL: what the gateway may call."""
        return self.filter(status=Agent.Status.ACTIVE, expires_at__gt=timezone.now())

    def with_tag(self, tag: str) -> AgentQuerySet:
        return self.filter(tags_index__contains=f"|{tag}|")


class Agent(models.Model):
    """A registered A2A agent: where it lives, its current card and its lease (TTL)."""

    class Status(models.TextChoices):
        ACTIVE = "active", "active"
        EXPIRED = "expired", "expired"

    class Source(models.TextChoices):
        API = "api", "REST API"
        KUBEMQ = "kubemq", "KubeMQ API"
        ADMIN = "admin", "admin"
        DISCOVERY = "discovery", "discovery"

    class Visibility(models.TextChoices):
        PRIVATE = "private", "private: its tenant only"
        PUBLIC = "public", "public: every tenant"
        SHARED = "shared", "shared: its tenant and the tenants named"

    tenant = tenant_field("agents")
    agent_id = models.CharField(max_length=63, db_index=True)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    url = models.URLField(max_length=2048, help_text="The endpoint the gateway POSTs to.")
    http_json_url = models.CharField(
        max_length=2048, blank=True, default="",
        help_text="The card's HTTP+JSON (REST) interface, where the gateway forwards that "
        "binding's calls (blank: the agent offers none).",
    )
    card = models.JSONField()
    card_raw = models.TextField(help_text="The card exactly as registered (signatures intact).")
    card_sha256 = models.CharField(max_length=64)
    card_shape = models.CharField(max_length=16)
    card_signature = models.CharField(
        max_length=12, blank=True, default="",
        help_text="Signature check of the current card (blank: not checked).",
    )
    # Denormalised, '|'-delimited indexes so list filters work the same on SQLite and PostgreSQL.
    tags_index = models.TextField(blank=True, default="")
    skills_index = models.TextField(blank=True, default="")
    input_modes_index = models.TextField(blank=True, default="")
    output_modes_index = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.API)
    ttl_seconds = models.PositiveIntegerField()
    max_concurrency = models.PositiveIntegerField()
    registered_at = models.DateTimeField()
    last_seen = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)
    node_id = models.CharField(max_length=200, blank=True, help_text="The owning node.")
    credential_passthrough = models.BooleanField(
        default=False,
        help_text="The caller's Authorization reaches the agent unchanged (agents with their own "
        "securitySchemes); callers authenticate to the gateway with X-Gateway-Authorization.",
    )
    push_relay = models.BooleanField(
        null=True, blank=True,
        help_text="Callers' push-notification webhooks relayed by the gateway (docs/push.md); "
        "empty: the node's A2A_PUSH_RELAY.",
    )
    owner = models.ForeignKey(
        "registry.ApiClient", null=True, blank=True, on_delete=models.SET_NULL,
        related_name="agents",
    )
    # The routing marker: set by every write that changes what a node's routing table holds
    # (register, update, status, ownership; a heartbeat only when it revives a lapsed lease),
    # so a node's resync reads only the rows changed since its last one. Set by the services
    # in registry/services/ (ORM writes and raw SQL alike).
    routing_changed_at = models.DateTimeField(default=timezone.now, db_index=True)
    # ARD entitlement tier: anonymous discovery (ai-catalog.json, /ard/v1) lists only these.
    public = models.BooleanField(
        default=False, help_text="Listed to anonymous callers of ARD discovery."
    )
    # Which tenants' callers may see and call it besides its own (docs/tenants.md).
    visibility = models.CharField(
        max_length=8, choices=Visibility.choices, default=Visibility.PRIVATE,
    )
    shared_with = models.ManyToManyField(
        Tenant, blank=True, related_name="shared_agents",
        help_text="With visibility 'shared': the other tenants that may see and call it.",
    )

    objects = AgentQuerySet.as_manager()

    class Meta:
        ordering = ["agent_id"]
        indexes = [
            models.Index(fields=["status", "expires_at"]),
            # The admin agent list's node filter at 100,000 agents. (No index on last_seen:
            # every heartbeat writes it; sorting the list by it reads the table once.)
            models.Index(fields=["node_id"], name="agent_node_id_idx"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "agent_id"], name="agent_unique_in_tenant"),
            models.CheckConstraint(condition=Q(ttl_seconds__gte=1), name="agent_ttl_positive"),
            models.CheckConstraint(
                condition=Q(max_concurrency__gte=1), name="agent_concurrency_positive"
            ),
        ]

    def __str__(self) -> str:
        return self.key

    @property
    def key(self) -> str:
        """The routing key (``registry.ids.agent_key``): unique across tenants."""
        return agent_key(str(self.tenant_id), self.agent_id)

    @property
    def tags(self) -> list[str]:
        return [t for t in self.tags_index.split("|") if t]

    @property
    def is_routable(self) -> bool:
        return self.status == self.Status.ACTIVE and self.expires_at > timezone.now()


SIGNATURE_CHOICES = [
    ("valid", "valid"), ("invalid", "invalid"), ("unsigned", "unsigned"),
    ("unknown_key", "unknown key"),
]


class AgentTombstone(models.Model):
    """A deregistered agent's id and when it went: how a node's incremental resync sees a
    deletion it missed the event of. Pruned by the expiry job after
    ``A2A_EXPIRED_RETENTION_SECONDS`` (a node's periodic full resync covers anything older)."""

    tenant = tenant_field("tombstones")
    agent_id = models.CharField(max_length=63)
    deleted_at = models.DateTimeField(default=timezone.now, db_index=True)

    def __str__(self) -> str:
        return agent_key(str(self.tenant_id), self.agent_id)


class CardVersion(models.Model):
    """Every distinct card an agent has published, so skill-list and endpoint changes show."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="card_versions")
    sha256 = models.CharField(max_length=64)
    # The card exactly as published; its parsed form is :attr:`card` (one stored copy: a
    # registration writes the card once here, not once as text and again as jsonb).
    card_raw = models.TextField()
    endpoint = models.URLField(max_length=2048)
    skill_ids = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now)
    # docs/signatures.md: valid, invalid, unsigned or unknown_key; blank: not checked (off).
    signature_status = models.CharField(
        "signature", max_length=12, blank=True, default="", choices=SIGNATURE_CHOICES
    )
    signature_kid = models.CharField(max_length=200, blank=True, default="")
    signature_detail = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["agent", "sha256"], name="card_version_unique")
        ]

    def __str__(self) -> str:
        return f"{self.agent_id}@{self.sha256[:12]}"

    @property
    def card(self) -> dict[str, Any]:
        """The card as a JSON object (``card_raw`` holds a registered card's bytes, always a
        JSON object: :func:`registry.cards.parse_card` refuses anything else)."""
        return orjson.loads(self.card_raw) if self.card_raw else {}


class ApiClient(AbstractAPIKey):
    """A caller of the API and the gateway. Its token is stored hashed (sha512), shown once."""

    class Scope(models.TextChoices):
        REGISTER = "register", "register"
        CALL = "call", "call"
        ADMIN = "admin", "admin"

    tenant = tenant_field("clients")
    client_id = models.SlugField(
        max_length=100, unique=True,
        help_text="Identity sent to agents in the caller-id header.",
    )
    scopes = models.JSONField(default=list, help_text='Any of "register", "call", "admin".')
    allowed_agents = models.JSONField(
        default=list, blank=True,
        help_text="Agent ids this client may call or register. Empty: any.",
    )

    class Meta(AbstractAPIKey.Meta):
        verbose_name = "API client"
        verbose_name_plural = "API clients"
        ordering = ["client_id"]  # type: ignore[assignment]  # a list, as in the migrations

    def __str__(self) -> str:
        return self.client_id


class Node(models.Model):
    """A server process of the cluster: it owns the virtual subscribers of agents on it."""

    node_id = models.CharField(max_length=200, unique=True)
    address = models.CharField(max_length=300, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    last_heartbeat = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["node_id"]

    def __str__(self) -> str:
        return self.node_id
