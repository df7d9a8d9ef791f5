from django.db import migrations

from audit.triggers import tables_joined


class Migration(migrations.Migration):
    """A replica's concurrency limit found by the gateway (adaptive
    concurrency) is an operation, left out of the audit trail like its
    health: every trigger reinstalled with serving_replica's new ignored
    columns."""

    dependencies = [("audit", "0007_redacted_changes")]

    operations = [tables_joined(())]
