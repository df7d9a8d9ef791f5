from django.db import migrations

from audit.triggers import tables_joined


class Migration(migrations.Migration):
    """People and their groups join the audit trail: who made whom finance
    staff, staff or superuser (single sign-on's grants among them)."""

    dependencies = [
        ("audit", "0005_via_sso"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [tables_joined(("auth_user", "auth_user_groups"))]
