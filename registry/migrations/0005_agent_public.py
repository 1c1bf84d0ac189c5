from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("registry", "0004_routing_version")]

    operations = [
        migrations.AddField(
            model_name="agent",
            name="public",
            field=models.BooleanField(
                default=False, help_text="Listed to anonymous callers of ARD discovery."
            ),
        ),
    ]
