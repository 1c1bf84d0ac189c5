"""Tenants (docs/tenants.md): audit rows name their tenant (a slug: they outlive tenants) and
statistics are keyed by the agent's routing key (up to 104 characters)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('console', '0003_agent_errors'),
    ]

    operations = [
        migrations.AddField(
            model_name='callrecord',
            name='tenant',
            field=models.CharField(db_index=True, default='default', max_length=40),
        ),
        migrations.AddField(
            model_name='registrychange',
            name='tenant',
            field=models.CharField(db_index=True, default='default', max_length=40),
        ),
        migrations.AlterField(
            model_name='agentminute',
            name='agent_id',
            field=models.CharField(help_text='The routing key (tenant.agent_id outside the default tenant).', max_length=104),
        ),
        migrations.AlterField(
            model_name='callrecord',
            name='agent_id',
            field=models.CharField(db_index=True, max_length=104),
        ),
        migrations.AlterField(
            model_name='registrychange',
            name='agent_id',
            field=models.CharField(blank=True, db_index=True, max_length=104),
        ),
    ]
