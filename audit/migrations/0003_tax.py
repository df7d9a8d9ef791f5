from django.db import migrations

TABLES = ("billing_taxprofile", "billing_taxrate")


def install(apps, schema_editor):
    from audit.triggers import triggers_install

    triggers_install(schema_editor)


def uninstall(apps, schema_editor):
    from audit.triggers import triggers_uninstall
    from audit.tracked import TRACKED

    triggers_uninstall(schema_editor, [t for t in TRACKED if t.table in TABLES])


class Migration(migrations.Migration):
    """Tenants' tax profiles and the tax rates join the audited tables."""

    dependencies = [
        ("audit", "0002_webhook_endpoints"),
        ("billing", "0019_tax"),
    ]

    operations = [migrations.RunPython(install, uninstall)]
