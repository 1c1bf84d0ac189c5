"""Console models: per-agent traffic by minute, the call audit log, the registry audit log and
when each API client was last seen at the gateway.

Statistics rows are written by each node for itself (``node_id`` in the key) and summed when
read, so a cluster's figures are the sum of its nodes'. Rows are upserted with absolute values
(a node is the only writer of its rows), so a flush may be repeated safely.
"""

from __future__ import annotations

from django.db import models

from registry.ids import DEFAULT_TENANT


class AgentMinute(models.Model):
    """One agent's gateway traffic on one node during one minute."""

    agent_id = models.CharField(max_length=104, help_text="The routing key (tenant.agent_id "
                                "outside the default tenant).")
    minute = models.DateTimeField(help_text="Start of the minute (UTC).")
    node_id = models.CharField(max_length=200)
    requests = models.PositiveIntegerField(default=0)
    errors_executed = models.PositiveIntegerField(
        default=0, help_text="Gateway errors after the agent received the request."
    )
    errors_not_executed = models.PositiveIntegerField(
        default=0,
        help_text="Gateway errors before the agent received the request (safe to retry).",
    )
    errors_agent = models.PositiveIntegerField(
        default=0,
        help_text="Agent errors: the agent answered a JSON-RPC error or an HTTP error status "
        "(relayed unchanged).",
    )
    bytes_in = models.PositiveBigIntegerField(default=0, help_text="Request bytes.")
    bytes_out = models.PositiveBigIntegerField(default=0, help_text="Response bytes.")
    latency_sum = models.FloatField(default=0.0, help_text="Seconds, summed.")
    histogram = models.JSONField(
        default=list, help_text="Request counts per log latency bucket (gateway.histogram)."
    )
    streams_max = models.PositiveIntegerField(default=0, help_text="Most SSE streams open.")
    last_call_at = models.DateTimeField(null=True, blank=True)
    last_outcome = models.CharField(max_length=32, blank=True)

    class Meta:
        ordering = ["-minute", "agent_id"]
        verbose_name = "agent minute"
        constraints = [
            models.UniqueConstraint(
                fields=["agent_id", "minute", "node_id"], name="agent_minute_unique"
            )
        ]
        indexes = [models.Index(fields=["minute", "agent_id"])]

    def __str__(self) -> str:
        return f"{self.agent_id} {self.minute:%Y-%m-%d %H:%M} {self.node_id}"


class CallRecord(models.Model):
    """One gateway call, metadata only (never bodies). Kept per ``A2A_AUDIT``."""

    at = models.DateTimeField(db_index=True)
    caller = models.CharField(max_length=200, db_index=True)
    # The agent's routing key (``registry.ids.agent_key``: ``tenant.agent_id`` outside the
    # default tenant) and its tenant. A slug, not a foreign key: audit rows outlive tenants,
    # and a refused call names whatever tenant its path named.
    tenant = models.CharField(max_length=40, default=DEFAULT_TENANT, db_index=True)
    agent_id = models.CharField(max_length=104, db_index=True)
    method = models.CharField(max_length=100)
    outcome = models.CharField(max_length=32, db_index=True)
    executed = models.BooleanField()
    http_status = models.PositiveSmallIntegerField(null=True)
    latency_ms = models.FloatField()
    request_bytes = models.PositiveBigIntegerField(default=0)
    response_bytes = models.PositiveBigIntegerField(default=0)
    node_id = models.CharField(max_length=200)
    count = models.PositiveIntegerField(
        default=1,
        help_text="Calls this row stands for: calls refused before reaching the agent (401, "
        "403, 429, agent_not_found) are one row per caller, agent and outcome per flush.",
    )

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name = "call"
        verbose_name_plural = "call audit log"

    def __str__(self) -> str:
        return f"{self.at:%H:%M:%S} {self.caller} -> {self.agent_id} {self.outcome}"


class RegistryChange(models.Model):
    """A registry change and who made it: registrations, new cards, deregistrations, tokens."""

    at = models.DateTimeField(db_index=True)
    action = models.CharField(max_length=40, db_index=True)
    actor = models.CharField(max_length=200, db_index=True)
    # The tenant the change happened in (a slug: audit rows outlive tenants).
    tenant = models.CharField(max_length=40, default=DEFAULT_TENANT, db_index=True)
    agent_id = models.CharField(max_length=104, blank=True, db_index=True)
    client_id = models.CharField(max_length=100, blank=True, db_index=True)
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name = "registry change"
        verbose_name_plural = "registry audit log"

    def __str__(self) -> str:
        return f"{self.action} {self.agent_id or self.client_id} by {self.actor}"


class ClientUsage(models.Model):
    """When an API client last called through the gateway, per node (the admin shows the max)."""

    client_id = models.CharField(max_length=200)
    node_id = models.CharField(max_length=200)
    last_used_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["client_id", "node_id"], name="client_usage_unique")
        ]

    def __str__(self) -> str:
        return f"{self.client_id}@{self.node_id}"
