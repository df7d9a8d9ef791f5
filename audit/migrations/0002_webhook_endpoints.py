from django.db import migrations

from audit.triggers import tables_joined


class Migration(migrations.Migration):
    """The webhook endpoints join the audited tables."""

    dependencies = [
        ("audit", "0001_initial"),
        ("webhooks", "0001_initial"),
    ]

    operations = [tables_joined(("webhooks_endpoint",))]
