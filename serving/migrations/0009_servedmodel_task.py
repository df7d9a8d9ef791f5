from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("serving", "0008_cost_currencies"),
    ]

    operations = [
        migrations.AddField(
            model_name="servedmodel",
            name="task",
            field=models.CharField(
                choices=[
                    ("generate", "Generates text (chat, completions, responses)"),
                    ("embed", "Embeds text (embeddings)"),
                ],
                default="generate",
                max_length=16,
            ),
        ),
    ]
