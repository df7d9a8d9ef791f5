from django.db import migrations

from audit.triggers import tables_joined


class Migration(migrations.Migration):
    """A tenant's own tax details, waiting for finance's confirmation, join
    the audit trail (who sent what, and when)."""

    dependencies = [
        ("audit", "0008_replica_concurrency_operations"),
        ("billing", "0021_tax_details_request"),
    ]

    operations = [tables_joined(("billing_taxdetailsrequest",))]
