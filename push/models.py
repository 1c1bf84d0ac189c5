"""The relayed push-notification configs and every push the gateway took from an agent.

Lean models (fields and constraints): the writes are :mod:`push.relay` (configs),
:mod:`push.ingress` (deliveries) and :mod:`push.delivery` (their states). A console view or a
metric reads ``PushDelivery`` by ``state``, ``attempts``, ``last_error`` and ``latency_ms``.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from registry.models import tenant_field


class RelayedConfig(models.Model):
    """A caller's push-notification config the gateway keeps; the agent got
    ``<relay base>/push/<id>`` and a secret (stored only as its SHA-256) instead."""

    id = models.CharField(primary_key=True, max_length=32)  # the relay id in the URL
    #: The agent's tenant when the config was relayed; a push is refused once the agent is no
    #: longer there (moved to another tenant, or deregistered).
    tenant = tenant_field("relayed_push_configs")
    agent_id = models.CharField(max_length=200, db_index=True)
    #: The registration the config was relayed for (the agent's row; 0: none was found). A
    #: later agent of the same id, registered after a deregistration or a move, is another
    #: one and cannot push with this config. Null on configs relayed before it was kept.
    agent_pk = models.BigIntegerField(
        null=True, blank=True,
        help_text="The agent's registration (row) the config was relayed for.")
    client_id = models.CharField(max_length=200, help_text="The calling API client.")
    config_id = models.CharField(max_length=200, blank=True, help_text="The caller's config id.")
    task_id = models.CharField(
        max_length=200, blank=True, db_index=True,
        help_text="The task the config is for; blank until the first push names it.")
    url = models.TextField(help_text="The caller's webhook.")
    token = models.TextField(blank=True, help_text="The caller's token, sent back with pushes.")
    authentication = models.JSONField(null=True, blank=True,
                                      help_text="The caller's authentication (scheme, "
                                      "credentials), sent as the Authorization header.")
    secret_sha256 = models.CharField(max_length=64)
    sequence = models.PositiveBigIntegerField(default=0, help_text="Pushes taken so far.")
    created_at = models.DateTimeField(default=timezone.now)
    last_push_at = models.DateTimeField(null=True, blank=True,
                                        help_text="When the agent last pushed to it.")
    task_done_at = models.DateTimeField(
        null=True, blank=True,
        help_text="When a push showed its task in a terminal state (completed, failed, "
        "canceled, rejected).")

    class Meta:
        verbose_name = "relayed push config"

    def __str__(self) -> str:
        return f"{self.agent_id}/{self.id}"


class PushDelivery(models.Model):
    """One push an agent sent, delivered to its config's webhook at least once."""

    class State(models.TextChoices):
        PENDING = "pending"  # not tried yet
        FAILED = "failed"  # tried and failed; retried at next_attempt_at
        DELIVERED = "delivered"
        DEAD = "dead"  # attempts exhausted: dead-lettered

    config = models.ForeignKey(RelayedConfig, on_delete=models.CASCADE,
                               related_name="deliveries")
    tenant = tenant_field("push_deliveries")  # its config's
    agent_id = models.CharField(max_length=200, db_index=True)
    task_id = models.CharField(max_length=200)
    sequence = models.PositiveBigIntegerField()
    body = models.BinaryField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    claimed_until = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_status = models.PositiveSmallIntegerField(null=True, blank=True)
    latency_ms = models.FloatField(null=True, blank=True,
                                   help_text="From the push's arrival to its delivery.")
    idempotency_key = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "push deliveries"
        constraints = [
            models.UniqueConstraint(fields=["config", "sequence"], name="push_delivery_order"),
        ]
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="push_due")]

    def __str__(self) -> str:
        return f"{self.config_id}#{self.sequence} {self.state}"
