"""The ARD search index: one document per registered agent, kept current by registry events.

The full-text parts are vendor-specific and live outside the ORM (created by migration 0001):
on PostgreSQL a generated, weighted ``tsvector`` column ``search`` with a GIN index; on SQLite an
FTS5 table ``ard_agentdoc_fts`` (external content, kept in step by triggers).
"""

from __future__ import annotations

from django.db import models


class AgentDoc(models.Model):
    """What discovery searches and lists for one agent: its catalog entry and indexed text."""

    # No database constraint: registry purges (bulk deletes) must not cascade into this app;
    # a document whose agent is gone is hidden by the join and pruned by the next rebuild.
    registry_agent = models.OneToOneField(
        "registry.Agent",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="ard_doc",
    )
    # The agent's routing key (registry.ids.agent_key: ``tenant.agent_id`` outside the
    # default tenant).
    agent_id = models.CharField(max_length=104, unique=True)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    skill_names = models.TextField(blank=True)
    skill_descriptions = models.TextField(blank=True)
    tags = models.TextField(blank=True)
    examples = models.TextField(blank=True)
    # '|'-delimited, for filters that work the same on SQLite and PostgreSQL.
    tags_index = models.TextField(blank=True, default="")
    capabilities_index = models.TextField(blank=True, default="")
    entry = models.JSONField(help_text="The catalog entry, without its gateway URL.")
    card_sha256 = models.CharField(max_length=64)
    updated_at = models.DateTimeField()
    # Copies of the registry's state, kept by its events, so a search never joins the registry:
    # ``active`` is off from the agent's ``expired`` event until it registers again.
    public = models.BooleanField(default=False)
    active = models.BooleanField(default=True)
    # Which tenants' callers may find it (docs/tenants.md, ``ard.indexer.reach_index``):
    # ``|*|`` every tenant, else ``|tenant|shared|...|``.
    reach = models.TextField(default="|default|")
    # The document's text embedded by ``embedding_model`` (float16 bytes, ard.embeddings), written
    # with the document; the node's in-process index (ard.vectors) is loaded from these.
    embedding = models.BinaryField(null=True, blank=True, editable=False)
    embedding_model = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["agent_id"]
        indexes = [
            models.Index(fields=["active", "public"], name="ard_doc_visible"),
            # the vector index catches up with other nodes' writes by this column
            models.Index(fields=["updated_at"], name="ard_doc_updated"),
        ]

    def __str__(self) -> str:
        return self.agent_id
