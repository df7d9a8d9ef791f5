from django.db import migrations

from audit.triggers import tables_joined


class Migration(migrations.Migration):
    """Tenants' tax profiles and the tax rates join the audited tables."""

    dependencies = [
        ("audit", "0002_webhook_endpoints"),
        ("billing", "0019_tax"),
    ]

    operations = [tables_joined(("billing_taxprofile", "billing_taxrate"))]
