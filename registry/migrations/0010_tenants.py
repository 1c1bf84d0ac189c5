"""Tenants (docs/tenants.md): the default tenant is created and every existing agent, API
client and tombstone belongs to it (the columns' default), so behaviour and data are unchanged;
agent ids become unique within a tenant."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


def create_default_tenant(apps, schema_editor):
    Tenant = apps.get_model("registry", "Tenant")
    Tenant.objects.get_or_create(slug="default", defaults={"name": "Default tenant"})


class Migration(migrations.Migration):

    dependencies = [
        ('registry', '0009_agent_http_json_url'),
    ]

    operations = [
        migrations.CreateModel(
            name='Tenant',
            fields=[
                ('slug', models.SlugField(max_length=40, primary_key=True, serialize=False)),
                ('name', models.CharField(max_length=200)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('max_agents', models.PositiveIntegerField(blank=True, help_text='Agents the tenant may have (empty: no limit).', null=True)),
                ('max_card_bytes', models.PositiveIntegerField(blank=True, help_text="The largest card its agents may register (empty: A2A's own cap only).", null=True)),
            ],
            options={
                'ordering': ['slug'],
            },
        ),
        # Before the foreign keys: their default names it.
        migrations.RunPython(create_default_tenant, migrations.RunPython.noop),
        migrations.AddField(
            model_name='agent',
            name='visibility',
            field=models.CharField(choices=[('private', 'private: its tenant only'), ('public', 'public: every tenant'), ('shared', 'shared: its tenant and the tenants named')], default='private', max_length=8),
        ),
        migrations.AlterField(
            model_name='agent',
            name='agent_id',
            field=models.CharField(db_index=True, max_length=63),
        ),
        migrations.AddField(
            model_name='agent',
            name='shared_with',
            field=models.ManyToManyField(blank=True, help_text="With visibility 'shared': the other tenants that may see and call it.", related_name='shared_agents', to='registry.tenant'),
        ),
        migrations.AddField(
            model_name='agent',
            name='tenant',
            field=models.ForeignKey(default='default', on_delete=django.db.models.deletion.PROTECT, related_name='agents', to='registry.tenant'),
        ),
        migrations.AddField(
            model_name='agenttombstone',
            name='tenant',
            field=models.ForeignKey(default='default', on_delete=django.db.models.deletion.PROTECT, related_name='tombstones', to='registry.tenant'),
        ),
        migrations.AddField(
            model_name='apiclient',
            name='tenant',
            field=models.ForeignKey(default='default', on_delete=django.db.models.deletion.PROTECT, related_name='clients', to='registry.tenant'),
        ),
        migrations.AddConstraint(
            model_name='agent',
            constraint=models.UniqueConstraint(fields=('tenant', 'agent_id'), name='agent_unique_in_tenant'),
        ),
    ]
