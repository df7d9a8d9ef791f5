"""Data: the Finance group holding the finance_staff permission."""

from django.db import migrations


def create_finance_group(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    content_type, _ = ContentType.objects.get_or_create(app_label="tenants", model="tenant")
    permission, _ = Permission.objects.get_or_create(
        codename="finance_staff",
        content_type=content_type,
        defaults={"name": "Platform finance staff: sees every tenant"},
    )
    group, _ = Group.objects.get_or_create(name="Finance")
    group.permissions.add(permission)


def remove_finance_group(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name="Finance").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_finance_group, remove_finance_group)]
