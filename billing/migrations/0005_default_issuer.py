"""Data: a default issuer, so invoices can be numbered out of the box
(finance renames it and fills in the address in the admin)."""

from django.db import migrations


def create(apps, schema_editor):
    Issuer = apps.get_model("billing", "Issuer")
    if not Issuer.objects.filter(is_default=True).exists():
        Issuer.objects.create(name="GPU Ledger Platform", is_default=True)


class Migration(migrations.Migration):
    dependencies = [("billing", "0004_invoice_immutable")]
    operations = [migrations.RunPython(create, migrations.RunPython.noop)]
