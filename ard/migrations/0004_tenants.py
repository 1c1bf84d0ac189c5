"""Tenants (docs/tenants.md): a document's ``agent_id`` is the agent's routing key
(``tenant.agent_id`` outside the default tenant, so up to 104 characters) and ``reach`` says
which tenants' callers may find it (every existing document: the default tenant's).

SQLite rebuilds the table, which drops the FTS5 triggers of 0001: restored as 0003 does."""

import importlib

from django.db import migrations, models

_embedding = importlib.import_module("ard.migrations.0003_embedding")


class Migration(migrations.Migration):

    dependencies = [
        ('ard', '0003_embedding'),
        ('registry', '0010_tenants'),
    ]

    operations = [
        migrations.AddField(
            model_name='agentdoc',
            name='reach',
            field=models.TextField(default='|default|'),
        ),
        migrations.AlterField(
            model_name='agentdoc',
            name='agent_id',
            field=models.CharField(max_length=104, unique=True),
        ),
        migrations.RunPython(_embedding.restore_fts_triggers, migrations.RunPython.noop),
    ]
