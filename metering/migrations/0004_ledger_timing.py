"""Whose clock a ledger row's timeline is (`timing`): the
engine's own per-request timings, or the gateway's window for an engine
that reports token counts only; and, per rollup, how many served requests
were timed by the gateway.

The ledger is partitioned and created by SQL, so its column is added by SQL
(ADD COLUMN on the parent reaches every partition). With a constant default
it is a change to the catalog; the rows recorded so far are then marked by
what they carry: engine timings (vLLM's) or none."""

from django.db import migrations, models

LEDGER_ADD = """
ALTER TABLE metering_usageevent ADD COLUMN timing varchar(8) NOT NULL DEFAULT 'gateway';
UPDATE metering_usageevent SET timing = 'engine'
 WHERE queue_ms IS NOT NULL OR ttft_ms IS NOT NULL OR generation_ms IS NOT NULL;
ALTER TABLE metering_usageevent ADD CONSTRAINT usageevent_timing_valid
    CHECK (timing IN ('engine', 'gateway'));
"""
LEDGER_DROP = "ALTER TABLE metering_usageevent DROP COLUMN timing"


class Migration(migrations.Migration):
    dependencies = [
        ("metering", "0003_window_gpu_units"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(LEDGER_ADD, reverse_sql=LEDGER_DROP)],
            state_operations=[
                migrations.AddField(
                    model_name="usageevent",
                    name="timing",
                    field=models.CharField(
                        choices=[
                            ("engine", "Measured by the engine"),
                            ("gateway", "The gateway's window (sent to last byte)"),
                        ],
                        default="gateway",
                        help_text="Whose clock the timeline is: the engine's, or the gateway's window.",
                        max_length=8,
                    ),
                ),
            ],
        ),
        migrations.AddField(
            model_name="usagerollup",
            name="requests_gateway_timed",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
    ]
