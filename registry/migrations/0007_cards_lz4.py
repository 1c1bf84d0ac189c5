from django.db import migrations

from core.toast import compress_with_lz4


class Migration(migrations.Migration):
    dependencies = [("registry", "0006_agent_node_id_index")]

    operations = [
        compress_with_lz4(("registry_agent", "card"), ("registry_agent", "card_raw"),
                          ("registry_cardversion", "card"), ("registry_cardversion", "card_raw")),
    ]
