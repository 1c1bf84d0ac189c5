"""Tenants (docs/tenants.md): discovery's configuration, snapshots and session pins belong to
a tenant; every existing row to the default tenant."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('discovery', '0006_need_text'),
        ('registry', '0010_tenants'),
    ]

    operations = [
        migrations.AddField(
            model_name='configuredagent',
            name='tenant',
            field=models.ForeignKey(default='default', on_delete=django.db.models.deletion.PROTECT, related_name='configured_agents', to='registry.tenant'),
        ),
        migrations.AddField(
            model_name='need',
            name='tenant',
            field=models.ForeignKey(default='default', on_delete=django.db.models.deletion.PROTECT, related_name='needs', to='registry.tenant'),
        ),
        migrations.AddField(
            model_name='sessionpin',
            name='tenant',
            field=models.ForeignKey(default='default', on_delete=django.db.models.deletion.PROTECT, related_name='session_pins', to='registry.tenant'),
        ),
        migrations.AddField(
            model_name='snapshot',
            name='tenant',
            field=models.ForeignKey(default='default', on_delete=django.db.models.deletion.PROTECT, related_name='snapshots', to='registry.tenant'),
        ),
        migrations.AddField(
            model_name='sourcefeed',
            name='tenant',
            field=models.ForeignKey(default='default', on_delete=django.db.models.deletion.PROTECT, related_name='source_feeds', to='registry.tenant'),
        ),
    ]
