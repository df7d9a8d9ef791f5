from django.db import migrations


def install(apps, schema_editor):
    from audit.triggers import triggers_install

    triggers_install(schema_editor)


def uninstall(apps, schema_editor):
    from audit.triggers import triggers_uninstall
    from audit.tracked import TRACKED

    triggers_uninstall(schema_editor, [t for t in TRACKED if t.table == "webhooks_endpoint"])


class Migration(migrations.Migration):
    """The webhook endpoints join the audited tables."""

    dependencies = [
        ("audit", "0001_initial"),
        ("webhooks", "0001_initial"),
    ]

    operations = [migrations.RunPython(install, uninstall)]
