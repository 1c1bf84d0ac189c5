from django.db import migrations

from core.toast import compress_with_lz4


class Migration(migrations.Migration):
    dependencies = [("discovery", "0004_catalog_source")]

    operations = [compress_with_lz4(("discovery_cardblob", "raw"), ("discovery_cardblob", "card"))]
