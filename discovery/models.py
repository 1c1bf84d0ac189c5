"""Discovery models: configuration (sources, allowlist, needs, policy), the card cache, endpoint
health, immutable snapshots with their session pins, and alerts.

Configuration rows come from the admin (``origin="admin"``) or from the ``DISCOVERY_CONFIG`` file
(``origin="file"``); both feed the same loop. Logic lives in the modules named after the seed's
concepts (``sources``, ``resolver``, ``card_cache``, ``matcher``, ``health``, ``snapshots``).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone

from discovery.names import local_name_error
from registry.ids import DEFAULT_TENANT
from registry.models import tenant_field


class Origin(models.TextChoices):
    ADMIN = "admin", "admin"
    FILE = "file", "config file"


class AllowedHost(models.Model):
    """A host the resolver may admit. A source only proposes; this list admits."""

    host = models.CharField(
        max_length=253, unique=True,
        help_text="Host name, *.suffix wildcard, IP address or CIDR.",
    )
    allow_http = models.BooleanField(
        default=False, help_text="Admit plain http for this host (https is required otherwise)."
    )
    origin = models.CharField(max_length=8, choices=Origin.choices, default=Origin.ADMIN)

    class Meta:
        ordering = ["host"]
        verbose_name = "allowed host"

    def __str__(self) -> str:
        return self.host + (" (http allowed)" if self.allow_http else "")


class ConfiguredAgent(models.Model):
    """A statically configured or probed endpoint with its reviewed local name and description."""

    class Kind(models.TextChoices):
        STATIC = "static", "static"
        PROBE = "probe", "domain probe"

    tenant = tenant_field("configured_agents")
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.STATIC)
    local_name = models.CharField(
        max_length=63,
        help_text="Identifier used in trees (never the card's name); agent id: lowercase, _ → -.",
    )
    url = models.URLField(max_length=2048, help_text="Base URL; the card is read at its "
                          "/.well-known/agent-card.json.")
    description = models.TextField(blank=True, help_text="Reviewed description (never the card's).")
    critical = models.BooleanField(default=False, help_text="Kept first when the cap bites.")
    enabled = models.BooleanField(default=True)
    origin = models.CharField(max_length=8, choices=Origin.choices, default=Origin.ADMIN)

    class Meta:
        ordering = ["local_name"]
        verbose_name = "configured agent"
        constraints = [  # a local name is unique within its tenant's tree
            models.UniqueConstraint(fields=["tenant", "local_name"],
                                    name="configured_agent_tenant_name"),
        ]

    def __str__(self) -> str:
        return self.local_name

    def clean(self) -> None:
        error = local_name_error(self.local_name)
        if error:
            raise ValidationError({"local_name": error})


class SourceFeed(models.Model):
    """A source that proposes many endpoints: a registry (this one or another instance's
    ``/api/v1/agents``) or Kubernetes Services carrying a label selector."""

    class Kind(models.TextChoices):
        LOCAL_REGISTRY = "registry_local", "this registry"
        REMOTE_REGISTRY = "registry_remote", "remote registry"
        KUBERNETES = "kubernetes", "Kubernetes services"
        CATALOG = "catalog", "ARD ai-catalog.json"

    tenant = tenant_field("source_feeds")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    url = models.URLField(
        max_length=2048, blank=True,
        help_text="Remote registry base URL, or Kubernetes API server (blank: in-cluster).",
    )
    label_selector = models.CharField(max_length=500, blank=True)
    namespace = models.CharField(max_length=253, blank=True, help_text="Blank: all namespaces.")
    options = models.JSONField(default=dict, blank=True, help_text="Extra source options.")
    enabled = models.BooleanField(default=True)
    origin = models.CharField(max_length=8, choices=Origin.choices, default=Origin.ADMIN)

    class Meta:
        ordering = ["kind", "url"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "kind", "url", "label_selector", "namespace"],
                name="source_feed_tenant_unique",
            ),
            models.CheckConstraint(
                condition=~Q(kind="registry_remote") | ~Q(url=""),
                name="source_feed_remote_has_url",
            ),
        ]

    def __str__(self) -> str:
        if self.kind == self.Kind.KUBERNETES:
            return f"kubernetes {self.namespace or '*'} {self.label_selector}"
        return f"{self.get_kind_display()} {self.url}".strip()


class CapabilityTag(models.Model):
    """One word of the reviewed tag vocabulary the organisation owns."""

    name = models.CharField(max_length=100, unique=True)
    meaning = models.TextField(blank=True)
    origin = models.CharField(max_length=8, choices=Origin.choices, default=Origin.ADMIN)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


#: The longest need given as text (it is indexed: a unique text per need).
NEED_TEXT_MAX = 500


class Need(models.Model):
    """A capability the platform needs, plus the modes it must accept/emit: a vocabulary tag
    (matched exactly against the skills' tags), or a description in words (``text``: matched by
    ARD's ranker, the cards scoring at least ``DISCOVERY_NEED_TEXT_MIN_SCORE``). One of the two."""

    tenant = tenant_field("needs")
    tag = models.ForeignKey(  # one need per tag and tenant (the constraint below)
        CapabilityTag, on_delete=models.CASCADE, related_name="needs", null=True, blank=True
    )
    text = models.CharField(
        max_length=NEED_TEXT_MAX, blank=True, default="",
        help_text="Instead of a tag: what is needed, in words (e.g. 'convert euros to yen'); "
                  "cards are matched by meaning, as ARD search ranks them.",
    )
    input_modes = models.JSONField(default=list, blank=True)
    output_modes = models.JSONField(default=list, blank=True)
    description = models.TextField(
        help_text="Reviewed description given to agents discovered for this need."
    )
    require_signed = models.BooleanField(
        default=False, help_text="Only cards with a valid signature from a trusted key match."
    )
    enabled = models.BooleanField(default=True)
    origin = models.CharField(max_length=8, choices=Origin.choices, default=Origin.ADMIN)

    class Meta:
        ordering = ["tag__name", "text"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(tag__isnull=False) & Q(text=""))
                | (Q(tag__isnull=True) & ~Q(text="")),
                name="need_tag_or_text",
            ),
            models.UniqueConstraint(
                fields=["tenant", "text"], condition=~Q(text=""), name="need_tenant_text_unique"
            ),
            models.UniqueConstraint(
                fields=["tenant", "tag"], condition=Q(tag__isnull=False),
                name="need_tenant_tag_unique",
            ),
        ]

    def __str__(self) -> str:
        what = self.tag.name if self.tag is not None else repr(self.text[:60])
        return f"{what} {self.input_modes}->{self.output_modes}"

    def clean(self) -> None:
        self.text = self.text.strip()
        if bool(self.tag_id) == bool(self.text):
            raise ValidationError("Give a tag or a text (what is needed, in words), not both.")
        for field in ("input_modes", "output_modes"):
            value = getattr(self, field)
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValidationError({field: "a list of media types"})


class DiscoveryPolicy(models.Model):
    """The one row of loop settings: cap and health thresholds (the file may set them)."""

    max_agents = models.PositiveIntegerField(default=20)
    degrade_after = models.PositiveIntegerField(default=3)
    recover_after = models.PositiveIntegerField(default=2)
    config_sha256 = models.CharField(max_length=64, blank=True, editable=False)

    class Meta:
        verbose_name = "discovery policy"
        verbose_name_plural = "discovery policy"
        constraints = [
            models.CheckConstraint(condition=Q(pk=1), name="discovery_policy_singleton"),
            models.CheckConstraint(condition=Q(max_agents__gte=1), name="policy_cap_positive"),
            models.CheckConstraint(condition=Q(degrade_after__gte=1), name="policy_degrade_pos"),
            models.CheckConstraint(condition=Q(recover_after__gte=1), name="policy_recover_pos"),
        ]

    def __str__(self) -> str:
        return "discovery policy"


class CardCacheEntry(models.Model):
    """A cached agent card, persisted so a restart does not refetch everything."""

    card_url = models.CharField(max_length=2048, unique=True)
    etag = models.CharField(max_length=512, blank=True)
    sha256 = models.CharField(max_length=64, blank=True)
    raw = models.BinaryField(null=True, blank=True)
    card = models.JSONField(null=True, blank=True)
    cache_control = models.CharField(max_length=300, blank=True)
    expires_at = models.DateTimeField(db_index=True)
    fetched_at = models.DateTimeField(null=True, blank=True, help_text="Last 200 or 304.")
    changed_at = models.DateTimeField(null=True, blank=True, help_text="Last time bytes changed.")
    failures = models.PositiveIntegerField(default=0, help_text="Consecutive failed fetches.")
    last_error = models.TextField(blank=True)
    last_status = models.PositiveSmallIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["card_url"]
        verbose_name = "card cache entry"
        verbose_name_plural = "card cache entries"

    def __str__(self) -> str:
        return self.card_url


class EndpointHealth(models.Model):
    """Health with hysteresis, per card URL: the loop's decision, not the cache's."""

    class State(models.TextChoices):
        HEALTHY = "healthy", "healthy"
        DEGRADED = "degraded", "degraded"

    card_url = models.CharField(max_length=2048, unique=True)
    state = models.CharField(max_length=8, choices=State.choices, default=State.HEALTHY)
    failure_streak = models.PositiveIntegerField(default=0)
    success_streak = models.PositiveIntegerField(default=0)
    changed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["card_url"]
        verbose_name_plural = "endpoint health"

    def __str__(self) -> str:
        return f"{self.card_url} {self.state}"


class CardBlob(models.Model):
    """Card bytes by sha256, shared by the snapshots that selected them."""

    sha256 = models.CharField(max_length=64, unique=True)
    raw = models.BinaryField()
    card = models.JSONField()

    def __str__(self) -> str:
        return self.sha256[:12]


class SnapshotQuerySet(models.QuerySet["Snapshot"]):
    def current(self, tenant: str = DEFAULT_TENANT) -> Snapshot | None:
        return self.filter(tenant_id=tenant).order_by("-version").first()


class Snapshot(models.Model):
    """An immutable, versioned list of a tenant's selected agents (versions count per tenant).
    Rows are never updated, only evicted (deleted) once no session pins them and a newer one of
    their tenant is current."""

    tenant = tenant_field("snapshots")
    version = models.PositiveBigIntegerField()
    digest = models.CharField(max_length=64, db_index=True)
    created_at = models.DateTimeField(default=timezone.now)
    agents = models.JSONField(
        default=list,
        help_text="[{local_name, description, agent_id, card_sha256, card_url, source}] "
                  "sorted by local name.",
    )
    agent_count = models.PositiveIntegerField(default=0)

    objects = SnapshotQuerySet.as_manager()

    class Meta:
        ordering = ["-version"]
        constraints = [
            models.CheckConstraint(condition=Q(version__gte=1), name="snapshot_v_pos"),
            models.UniqueConstraint(fields=["tenant", "version"], name="snapshot_tenant_version"),
        ]

    def __str__(self) -> str:
        return f"v{self.version} {self.digest[:12]}"


class SessionPin(models.Model):
    """A session pinned to its tenant's snapshot current when it started. Session ids are
    chosen by callers: unique within a tenant."""

    tenant = tenant_field("session_pins")
    session_id = models.CharField(max_length=200)
    snapshot = models.ForeignKey(Snapshot, on_delete=models.PROTECT, related_name="pins")
    client_id = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "session_id"], name="session_pin_tenant_id"),
        ]

    def __str__(self) -> str:
        return self.session_id


class Alert(models.Model):
    """Something an operator should know: stored, logged, counted, optionally sent to a hook.
    A tenant's cycle raises its alerts in that tenant; what the tenants share (card changes
    and fetch failures of the card cache) raises platform alerts (no tenant)."""

    class Kind(models.TextChoices):
        SKILLS_CHANGED = "skills_changed", "skill list changed"
        ENDPOINT_CHANGED = "endpoint_changed", "endpoint changed"
        FETCH_FAILURES = "fetch_failures", "repeated fetch failures"
        NAME_COLLISION = "name_collision", "name collision"
        CAP_REACHED = "cap_reached", "cap reached"
        REFUSED = "refused", "endpoint refused"
        SIGNATURE_INVALID = "signature_invalid", "card signature not valid"

    kind = models.CharField(max_length=20, choices=Kind.choices, db_index=True)
    tenant = models.ForeignKey(
        "registry.Tenant", on_delete=models.CASCADE, null=True, blank=True,
        related_name="discovery_alerts",
        help_text="The tenant whose discovery raised it (its sources, needs, snapshot); empty: "
                  "the platform's (the shared card cache and endpoint health).",
    )
    subject = models.CharField(max_length=2048)
    message = models.TextField()
    details = models.JSONField(default=dict, blank=True)
    fingerprint = models.CharField(max_length=64, blank=True, db_index=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    acknowledged = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.subject}"


class CycleRun(models.Model):
    """What one discovery cycle did (the last ``KEEP`` are kept), for the operator console."""

    KEEP = 500

    started_at = models.DateTimeField(default=timezone.now, db_index=True)
    seconds = models.FloatField(default=0.0)
    fetched = models.PositiveIntegerField(default=0, help_text="Cards fetched (HTTP 200).")
    not_modified = models.PositiveIntegerField(default=0, help_text="Revalidated (HTTP 304).")
    failed = models.PositiveIntegerField(default=0)
    selected = models.PositiveIntegerField(default=0)
    published = models.BooleanField(default=False, help_text="A new snapshot was published.")
    version = models.PositiveBigIntegerField(null=True, blank=True)
    digest = models.CharField(max_length=64, blank=True)
    summary = models.TextField(blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        verbose_name = "discovery cycle"

    def __str__(self) -> str:
        return f"cycle {self.started_at:%Y-%m-%d %H:%M:%S}"


class CatalogListing(models.Model):
    """An A2A agent entry last seen in an ARD ``ai-catalog.json``: its URN, where it was listed
    and its ``trustManifest`` (kept as published; nothing here verifies it)."""

    card_url = models.CharField(max_length=2048, unique=True)
    identifier = models.CharField(max_length=500)
    display_name = models.CharField(max_length=500, blank=True)
    catalog_url = models.CharField(max_length=2048, help_text="The catalog that listed it.")
    source_url = models.CharField(
        max_length=2048, help_text="The configured catalog (root of any nesting)."
    )
    trust_manifest = models.JSONField(null=True, blank=True)
    seen_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["identifier"]

    def __str__(self) -> str:
        return self.identifier
