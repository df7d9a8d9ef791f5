"""Time in the gateway's queue: a ledger column and its hourly rollups.

The ledger is a partitioned table created by SQL (its model is unmanaged),
so its column is added by SQL too; ADD COLUMN on the partitioned parent
reaches every partition. Nullable, no default and no CHECK: a change to the
catalog only, with no scan of the existing rows (they stay null: not
measured). Validation refuses a negative value before it gets here."""

from django.db import migrations, models

LEDGER_ADD = "ALTER TABLE metering_usageevent ADD COLUMN gateway_queue_ms numeric(14, 3) NULL"
LEDGER_DROP = "ALTER TABLE metering_usageevent DROP COLUMN gateway_queue_ms"


class Migration(migrations.Migration):
    dependencies = [
        ("metering", "0001_ledger"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(LEDGER_ADD, reverse_sql=LEDGER_DROP)],
            state_operations=[
                migrations.AddField(
                    model_name="usageevent",
                    name="gateway_queue_ms",
                    field=models.DecimalField(
                        decimal_places=3,
                        help_text="In the gateway's queue before dispatch (null: not measured).",
                        max_digits=14,
                        null=True,
                    ),
                ),
            ],
        ),
        migrations.AddField(
            model_name="usagerollup",
            name="gateway_queue_ms_sum",
            field=models.DecimalField(db_default=0, decimal_places=3, default=0, max_digits=24),
        ),
        migrations.AddField(
            model_name="usagerollup",
            name="gateway_queue_requests",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="usagerollup",
            name="gateway_queued_requests",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
    ]
