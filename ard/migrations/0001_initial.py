"""The ARD search index table, then its vendor-specific full-text parts.

PostgreSQL: a generated, weighted ``tsvector`` column (``search``) and a GIN index on it.
SQLite: an FTS5 external-content table (porter stemming) kept in step by triggers. Other
databases get the plain table (the portable ranker serves them).
"""

from django.db import migrations, models

PG_FORWARD = [
    """
    ALTER TABLE ard_agentdoc ADD COLUMN search tsvector GENERATED ALWAYS AS (
        setweight(to_tsvector('english', coalesce(name, '')), 'A') ||
        setweight(to_tsvector('english', coalesce(skill_names, '')), 'A') ||
        setweight(to_tsvector('english', coalesce(tags, '')), 'B') ||
        setweight(to_tsvector('english', coalesce(description, '')), 'B') ||
        setweight(to_tsvector('english', coalesce(skill_descriptions, '')), 'C') ||
        setweight(to_tsvector('english', coalesce(examples, '')), 'C')
    ) STORED
    """,
    "CREATE INDEX ard_agentdoc_search_gin ON ard_agentdoc USING GIN (search)",
]
PG_BACKWARD = [
    "DROP INDEX IF EXISTS ard_agentdoc_search_gin",
    "ALTER TABLE ard_agentdoc DROP COLUMN IF EXISTS search",
]

_COLS = "name, skill_names, tags, description, skill_descriptions, examples"
_NEW = ", ".join(f"new.{c.strip()}" for c in _COLS.split(","))
_OLD = ", ".join(f"old.{c.strip()}" for c in _COLS.split(","))
SQLITE_FORWARD = [
    f"""CREATE VIRTUAL TABLE ard_agentdoc_fts USING fts5(
        {_COLS}, content='ard_agentdoc', content_rowid='id', tokenize='porter unicode61')""",
    f"""CREATE TRIGGER ard_agentdoc_fts_ai AFTER INSERT ON ard_agentdoc BEGIN
        INSERT INTO ard_agentdoc_fts(rowid, {_COLS}) VALUES (new.id, {_NEW}); END""",
    f"""CREATE TRIGGER ard_agentdoc_fts_ad AFTER DELETE ON ard_agentdoc BEGIN
        INSERT INTO ard_agentdoc_fts(ard_agentdoc_fts, rowid, {_COLS})
        VALUES ('delete', old.id, {_OLD}); END""",
    f"""CREATE TRIGGER ard_agentdoc_fts_au AFTER UPDATE ON ard_agentdoc BEGIN
        INSERT INTO ard_agentdoc_fts(ard_agentdoc_fts, rowid, {_COLS})
        VALUES ('delete', old.id, {_OLD});
        INSERT INTO ard_agentdoc_fts(rowid, {_COLS}) VALUES (new.id, {_NEW}); END""",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS ard_agentdoc_fts_au",
    "DROP TRIGGER IF EXISTS ard_agentdoc_fts_ad",
    "DROP TRIGGER IF EXISTS ard_agentdoc_fts_ai",
    "DROP TABLE IF EXISTS ard_agentdoc_fts",
]


def _run(statements_by_vendor):
    def run(apps, schema_editor):
        for sql in statements_by_vendor.get(schema_editor.connection.vendor, []):
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    initial = True

    dependencies = [("registry", "0005_agent_public")]

    operations = [
        migrations.CreateModel(
            name="AgentDoc",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("agent_id", models.CharField(max_length=63, unique=True)),
                ("name", models.CharField(max_length=200)),
                ("description", models.TextField(blank=True)),
                ("skill_names", models.TextField(blank=True)),
                ("skill_descriptions", models.TextField(blank=True)),
                ("tags", models.TextField(blank=True)),
                ("examples", models.TextField(blank=True)),
                ("tags_index", models.TextField(blank=True, default="")),
                ("capabilities_index", models.TextField(blank=True, default="")),
                ("entry", models.JSONField(
                    help_text="The catalog entry, without its gateway URL.")),
                ("card_sha256", models.CharField(max_length=64)),
                ("updated_at", models.DateTimeField()),
                ("public", models.BooleanField(default=False)),
                ("active", models.BooleanField(default=True)),
                ("registry_agent", models.OneToOneField(
                    db_constraint=False, on_delete=models.DO_NOTHING, related_name="ard_doc",
                    to="registry.agent")),
            ],
            options={
                "ordering": ["agent_id"],
                "indexes": [models.Index(fields=["active", "public"], name="ard_doc_visible")],
            },
        ),
        migrations.RunPython(
            _run({"postgresql": PG_FORWARD, "sqlite": SQLITE_FORWARD}),
            _run({"postgresql": PG_BACKWARD, "sqlite": SQLITE_BACKWARD}),
        ),
    ]
