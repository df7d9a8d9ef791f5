from django.db import migrations

from audit.triggers import tables_joined


class Migration(migrations.Migration):
    """Permissions granted directly, to a person or a group, join the audit
    trail: granting finance_staff in the admin left no record (issue 60)."""

    dependencies = [("audit", "0009_tax_details_request")]

    operations = [tables_joined(("auth_user_user_permissions", "auth_group_permissions"))]
