"""Each search document's embedding (and the model that made it), and an index on
``updated_at`` by which a node's vector index catches up with the others' writes.

SQLite adds the columns by rebuilding the table, which drops the FTS5 triggers of 0001: they
are created again and the full-text table rebuilt from the documents."""

import importlib

from django.db import migrations, models

_initial = importlib.import_module("ard.migrations.0001_initial")


def restore_fts_triggers(apps, schema_editor):
    if schema_editor.connection.vendor != "sqlite":
        return
    for statement in _initial.SQLITE_FORWARD:
        if statement.lstrip().startswith("CREATE TRIGGER"):
            name = statement.split()[2]
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")
            schema_editor.execute(statement)
    schema_editor.execute("INSERT INTO ard_agentdoc_fts(ard_agentdoc_fts) VALUES ('rebuild')")


class Migration(migrations.Migration):
    dependencies = [("ard", "0002_entry_lz4")]

    operations = [
        migrations.AddField(
            model_name="agentdoc",
            name="embedding",
            field=models.BinaryField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="agentdoc",
            name="embedding_model",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
        migrations.AddIndex(
            model_name="agentdoc",
            index=models.Index(fields=["updated_at"], name="ard_doc_updated"),
        ),
        migrations.RunPython(restore_fts_triggers, migrations.RunPython.noop),
    ]
