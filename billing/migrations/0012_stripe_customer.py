"""Each tenant's Stripe customer moves from tenants (Tenant.stripe_customer_id)
to billing (StripeCustomer, one row per tenant that has a customer). The
ids are copied here, before tenants 0005 drops the column; going back,
they are copied to the column again."""

from collections import Counter

import django.db.models.deletion
from django.db import migrations, models


def customers_copy_from_tenants(apps, schema_editor):
    Tenant = apps.get_model("tenants", "Tenant")
    StripeCustomer = apps.get_model("billing", "StripeCustomer")
    linked = Tenant.objects.exclude(stripe_customer_id="").order_by("pk")
    pairs = list(linked.values_list("pk", "stripe_customer_id"))
    shared = [c for c, n in Counter(c for _, c in pairs).items() if n > 1]
    if shared:
        raise RuntimeError(
            "these Stripe customers are linked to more than one tenant; "
            f"unlink all but one first: {', '.join(sorted(shared))}"
        )
    StripeCustomer.objects.bulk_create(
        StripeCustomer(tenant_id=tenant_id, stripe_customer_id=customer)
        for tenant_id, customer in pairs
    )


def customers_copy_to_tenants(apps, schema_editor):
    Tenant = apps.get_model("tenants", "Tenant")
    StripeCustomer = apps.get_model("billing", "StripeCustomer")
    for tenant_id, customer in StripeCustomer.objects.values_list(
        "tenant_id", "stripe_customer_id"
    ):
        Tenant.objects.filter(pk=tenant_id).update(stripe_customer_id=customer)


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0011_invoice_finalize_early"),
        ("tenants", "0004_budget_block"),
    ]

    operations = [
        migrations.CreateModel(
            name="StripeCustomer",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("stripe_customer_id", models.CharField(max_length=255, unique=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "tenant",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="stripe_customer",
                        to="tenants.tenant",
                    ),
                ),
            ],
            options={
                "ordering": ["tenant__name"],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("stripe_customer_id", ""), _negated=True),
                        name="stripecustomer_id_not_empty",
                    )
                ],
            },
        ),
        migrations.RunPython(customers_copy_from_tenants, customers_copy_to_tenants),
    ]
