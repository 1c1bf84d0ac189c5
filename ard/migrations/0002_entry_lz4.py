from django.db import migrations

from core.toast import compress_with_lz4


class Migration(migrations.Migration):
    dependencies = [("ard", "0001_initial")]

    operations = [compress_with_lz4(("ard_agentdoc", "entry"))]
