"""The Stripe customer id is billing's now (billing.StripeCustomer): the
column goes once billing 0012 has copied it."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0004_budget_block"),
        ("billing", "0012_stripe_customer"),
    ]

    operations = [
        migrations.RemoveField(model_name="tenant", name="stripe_customer_id"),
    ]
