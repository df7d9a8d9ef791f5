from django.db import migrations

from audit.triggers import tables_joined


class Migration(migrations.Migration):
    """The trigger function names a redacted column's change (a password
    set, a secret replaced) without copying its values."""

    dependencies = [("audit", "0006_users")]

    operations = [tables_joined(())]
