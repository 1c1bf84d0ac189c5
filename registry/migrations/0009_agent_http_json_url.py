from django.db import migrations, models

from registry.bindings import http_json_endpoint


def fill_from_cards(apps, schema_editor):
    """Agents registered before: their HTTP+JSON interface from the card stored with them."""
    Agent = apps.get_model("registry", "Agent")
    for pk, card in Agent.objects.values_list("pk", "card").iterator(chunk_size=500):
        url = http_json_endpoint(card) if isinstance(card, dict) else ""
        if url:
            Agent.objects.filter(pk=pk).update(http_json_url=url[:2048])


class Migration(migrations.Migration):

    dependencies = [
        ("registry", "0008_cardversion_card_from_raw"),
    ]

    operations = [
        migrations.AddField(
            model_name="agent",
            name="http_json_url",
            field=models.CharField(
                blank=True, default="", max_length=2048,
                help_text="The card's HTTP+JSON (REST) interface, where the gateway forwards "
                "that binding's calls (blank: the agent offers none).",
            ),
        ),
        migrations.RunPython(fill_from_cards, migrations.RunPython.noop),
    ]
