from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("registry", "0003_agent_credential_passthrough")]

    operations = [
        migrations.AddField(
            model_name="agent",
            name="public",
            field=models.BooleanField(
                default=False, help_text="Listed to anonymous callers of ARD discovery."
            ),
        ),
    ]
