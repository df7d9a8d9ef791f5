"""A tenant's share and queue at the gateway (fair queuing): weight,
queue timeout and queue bound, with defaults for every existing policy."""

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0005_remove_tenant_stripe_customer_id"),
    ]

    operations = [
        migrations.AddField(
            model_name="tenantpolicy",
            name="fair_share_weight",
            field=models.PositiveSmallIntegerField(
                default=1,
                help_text="Share of a contended replica against other tenants of the same priority class: a weight of 2 gets twice the token service of a weight of 1.",
                validators=[
                    django.core.validators.MinValueValidator(1),
                    django.core.validators.MaxValueValidator(1000),
                ],
            ),
        ),
        migrations.AddField(
            model_name="tenantpolicy",
            name="max_queued_requests",
            field=models.PositiveIntegerField(
                default=100,
                help_text="Requests that may wait at the gateway at once; more are refused (429).",
                validators=[django.core.validators.MaxValueValidator(10000)],
            ),
        ),
        migrations.AddField(
            model_name="tenantpolicy",
            name="queue_timeout_ms",
            field=models.PositiveIntegerField(
                default=5000,
                help_text="How long a request may wait at the gateway (for a replica slot or under the concurrency and in-flight token limits) before a 429; 0 never waits.",
                validators=[django.core.validators.MaxValueValidator(600000)],
            ),
        ),
        migrations.AddConstraint(
            model_name="tenantpolicy",
            constraint=models.CheckConstraint(
                condition=models.Q(("fair_share_weight__gt", 0)),
                name="policy_fair_share_weight_positive",
            ),
        ),
        migrations.AddConstraint(
            model_name="tenantpolicy",
            constraint=models.CheckConstraint(
                condition=models.Q(("queue_timeout_ms__lte", 600000)),
                name="policy_queue_timeout_bounded",
            ),
        ),
        migrations.AddConstraint(
            model_name="tenantpolicy",
            constraint=models.CheckConstraint(
                condition=models.Q(("max_queued_requests__lte", 10000)),
                name="policy_max_queued_bounded",
            ),
        ),
    ]
