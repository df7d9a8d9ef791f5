"""Service levels: SLO policies (per plan, or per tier by default) with
their SLA credit schedules, finance's waivers and adjustments of credits,
and invoice lines of kind sla_credit naming the metric they credit."""

import django.core.validators
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0012_stripe_customer'),
        ('tenants', '0005_remove_tenant_stripe_customer_id'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='SlaCreditAdjustment',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('period_start', models.DateTimeField()),
                ('metric', models.CharField(choices=[('availability', 'Availability'), ('ttft_p95', 'Time to first token, p95'), ('itl_p95', 'Inter-token latency, p95')], max_length=16)),
                ('action', models.CharField(choices=[('waive', 'Waived'), ('adjust', 'Adjusted')], max_length=16)),
                ('credit_percent', models.DecimalField(blank=True, decimal_places=2, max_digits=5, null=True, validators=[django.core.validators.MinValueValidator(0), django.core.validators.MaxValueValidator(100)])),
                ('reason', models.CharField(max_length=300)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'ordering': ['-created_at', '-pk'],
            },
        ),
        migrations.CreateModel(
            name='SlaCreditRule',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('metric', models.CharField(choices=[('availability', 'Availability'), ('ttft_p95', 'Time to first token, p95'), ('itl_p95', 'Inter-token latency, p95')], max_length=16)),
                ('threshold', models.DecimalField(blank=True, decimal_places=4, help_text="Empty: the policy's target for the metric.", max_digits=12, null=True, validators=[django.core.validators.MinValueValidator(0)])),
                ('credit_percent', models.DecimalField(decimal_places=2, max_digits=5, validators=[django.core.validators.MinValueValidator(0), django.core.validators.MaxValueValidator(100)])),
            ],
            options={
                'ordering': ['policy', 'metric', '-credit_percent'],
            },
        ),
        migrations.CreateModel(
            name='SloPolicy',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100, unique=True)),
                ('tier', models.CharField(blank=True, choices=[('shared', 'Shared'), ('reserved', 'Reserved'), ('dedicated', 'Dedicated')], default='', help_text="For tenants of this tier whose plan has no policy; empty for a plan's.", max_length=16)),
                ('ttft_p95_ms', models.DecimalField(blank=True, decimal_places=3, max_digits=12, null=True, validators=[django.core.validators.MinValueValidator(0)])),
                ('itl_p95_ms', models.DecimalField(blank=True, decimal_places=3, max_digits=12, null=True, validators=[django.core.validators.MinValueValidator(0)])),
                ('availability_percent', models.DecimalField(blank=True, decimal_places=4, max_digits=7, null=True, validators=[django.core.validators.MinValueValidator(0), django.core.validators.MaxValueValidator(100)])),
                ('credit_cap_percent', models.DecimalField(decimal_places=2, default=100, help_text="The most one period's credits add up to.", max_digits=5, validators=[django.core.validators.MinValueValidator(0), django.core.validators.MaxValueValidator(100)])),
            ],
            options={
                'verbose_name_plural': 'SLO policies',
                'ordering': ['name'],
            },
        ),
        migrations.RemoveConstraint(
            model_name='invoiceline',
            name='line_kind_valid',
        ),
        migrations.AddField(
            model_name='invoiceline',
            name='sla_metric',
            field=models.CharField(blank=True, default='', max_length=16),
        ),
        migrations.AlterField(
            model_name='invoiceline',
            name='kind',
            field=models.CharField(choices=[('tokens', 'Tokens'), ('gpu_seconds', 'GPU-seconds'), ('reservation', 'Reserved GPUs'), ('dedicated', 'Dedicated GPUs'), ('discount', 'Discount'), ('commit_true_up', 'Minimum commitment true-up'), ('credit', 'Prepaid credit applied'), ('sla_credit', 'SLA credit')], max_length=16),
        ),
        migrations.AddConstraint(
            model_name='invoiceline',
            constraint=models.CheckConstraint(condition=models.Q(('kind__in', ['tokens', 'gpu_seconds', 'reservation', 'dedicated', 'discount', 'commit_true_up', 'credit', 'sla_credit'])), name='line_kind_valid'),
        ),
        migrations.AddField(
            model_name='slacreditadjustment',
            name='created_by',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name='slacreditadjustment',
            name='tenant',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='tenants.tenant'),
        ),
        migrations.AddField(
            model_name='slopolicy',
            name='plan',
            field=models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='slo_policy', to='billing.plan'),
        ),
        migrations.AddField(
            model_name='slacreditrule',
            name='policy',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='credit_rules', to='billing.slopolicy'),
        ),
        migrations.AddIndex(
            model_name='slacreditadjustment',
            index=models.Index(fields=['tenant', 'period_start'], name='slaadjust_period'),
        ),
        migrations.AddConstraint(
            model_name='slacreditadjustment',
            constraint=models.CheckConstraint(condition=models.Q(('metric__in', ['availability', 'ttft_p95', 'itl_p95'])), name='slaadjust_metric_valid'),
        ),
        migrations.AddConstraint(
            model_name='slacreditadjustment',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('action', 'waive'), ('credit_percent__isnull', True)), models.Q(('action', 'adjust'), ('credit_percent__gte', 0), ('credit_percent__lte', 100)), _connector='OR'), name='slaadjust_action_percent'),
        ),
        migrations.AddConstraint(
            model_name='slacreditadjustment',
            constraint=models.CheckConstraint(condition=models.Q(('reason', ''), _negated=True), name='slaadjust_reason'),
        ),
        migrations.AddConstraint(
            model_name='slopolicy',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('plan__isnull', False), ('tier', '')), models.Q(('plan__isnull', True), models.Q(('tier', ''), _negated=True)), _connector='OR'), name='slopolicy_plan_or_tier'),
        ),
        migrations.AddConstraint(
            model_name='slopolicy',
            constraint=models.UniqueConstraint(condition=models.Q(('plan__isnull', True)), fields=('tier',), name='slopolicy_one_per_tier'),
        ),
        migrations.AddConstraint(
            model_name='slopolicy',
            constraint=models.CheckConstraint(condition=models.Q(('credit_cap_percent__gte', 0), ('credit_cap_percent__lte', 100)), name='slopolicy_cap_percent'),
        ),
        migrations.AddConstraint(
            model_name='slacreditrule',
            constraint=models.UniqueConstraint(fields=('policy', 'metric', 'threshold'), name='slacreditrule_unique', nulls_distinct=False),
        ),
        migrations.AddConstraint(
            model_name='slacreditrule',
            constraint=models.CheckConstraint(condition=models.Q(('metric__in', ['availability', 'ttft_p95', 'itl_p95'])), name='slacreditrule_metric_valid'),
        ),
        migrations.AddConstraint(
            model_name='slacreditrule',
            constraint=models.CheckConstraint(condition=models.Q(('credit_percent__gt', 0), ('credit_percent__lte', 100)), name='slacreditrule_percent'),
        ),
    ]
