"""A need given as text instead of a tag (matched by ARD's ranker): ``text``, ``tag`` optional,
exactly one of the two."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("discovery", "0005_card_blobs_lz4"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="need",
            options={"ordering": ["tag__name", "text"]},
        ),
        migrations.AddField(
            model_name="need",
            name="text",
            field=models.CharField(
                blank=True,
                default="",
                help_text="Instead of a tag: what is needed, in words (e.g. 'convert euros to yen'); cards are matched by meaning, as ARD search ranks them.",
                max_length=500,
            ),
        ),
        migrations.AlterField(
            model_name="need",
            name="tag",
            field=models.OneToOneField(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="need",
                to="discovery.capabilitytag",
            ),
        ),
        migrations.AddConstraint(
            model_name="need",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("tag__isnull", False), ("text", "")),
                    models.Q(("tag__isnull", True), models.Q(("text", ""), _negated=True)),
                    _connector="OR",
                ),
                name="need_tag_or_text",
            ),
        ),
        migrations.AddConstraint(
            model_name="need",
            constraint=models.UniqueConstraint(
                condition=models.Q(("text", ""), _negated=True),
                fields=("text",),
                name="need_text_unique",
            ),
        ),
    ]
