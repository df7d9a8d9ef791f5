from django.db import migrations


def install(apps, schema_editor):
    from audit.triggers import triggers_install

    triggers_install(schema_editor)


class Migration(migrations.Migration):
    """The webhook endpoints join the audited tables."""

    dependencies = [
        ("audit", "0001_initial"),
        ("webhooks", "0001_initial"),
    ]

    operations = [migrations.RunPython(install, migrations.RunPython.noop)]
