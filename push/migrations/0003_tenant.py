"""Tenants (docs/push.md): a relayed config and its deliveries carry the agent's tenant,
filled for existing rows from the agent's routing key (``acme.echo``: acme; a bare id: the
default tenant)."""

import django.db.models.deletion
from django.db import migrations, models


def fill_tenants(apps, schema_editor):
    tenants = apps.get_model("registry", "Tenant").objects.exclude(slug="default")
    for model in ("RelayedConfig", "PushDelivery"):
        rows = apps.get_model("push", model).objects
        for slug in tenants.values_list("slug", flat=True):
            rows.filter(agent_id__startswith=f"{slug}.").update(tenant_id=slug)


class Migration(migrations.Migration):

    dependencies = [
        ('push', '0002_config_purge'),
        ('registry', '0011_agent_push_relay'),
    ]

    operations = [
        migrations.AddField(
            model_name='pushdelivery',
            name='tenant',
            field=models.ForeignKey(default='default', on_delete=django.db.models.deletion.PROTECT, related_name='push_deliveries', to='registry.tenant'),
        ),
        migrations.AddField(
            model_name='relayedconfig',
            name='tenant',
            field=models.ForeignKey(default='default', on_delete=django.db.models.deletion.PROTECT, related_name='relayed_push_configs', to='registry.tenant'),
        ),
        migrations.RunPython(fill_tenants, migrations.RunPython.noop),
    ]
