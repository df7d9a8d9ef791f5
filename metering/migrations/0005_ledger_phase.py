"""Disaggregated serving. A request served by a prefill replica
and a decode replica has a ledger row per phase under one request id, so a
row is unique by (request id, phase): the ledger's primary key and the
idempotency keys become (request_id, phase[, received_at]). A whole request
(every row so far) is phase 'whole'.

The ledger is partitioned and created by SQL, so it is changed by SQL: a
column with a constant default is a change to the catalog; the primary key
is rebuilt on each partition. Django's state keeps request_id as the
models' key (it cannot move a key to several columns); nothing saves these
rows through the ORM (metering.ledger writes them with SQL)."""

from django.db import migrations, models

PHASES = [("whole", "Whole request"), ("prefill", "Prefill phase"), ("decode", "Decode phase")]

FORWARD = """
ALTER TABLE metering_usageevent ADD COLUMN phase varchar(8) NOT NULL DEFAULT 'whole';
ALTER TABLE metering_usageevent ADD CONSTRAINT usageevent_phase_valid
    CHECK (phase IN ('whole', 'prefill', 'decode'));
ALTER TABLE metering_usageevent DROP CONSTRAINT metering_usageevent_pkey;
ALTER TABLE metering_usageevent ADD PRIMARY KEY (request_id, phase, received_at);
ALTER TABLE metering_usagekey ADD COLUMN phase varchar(8) NOT NULL DEFAULT 'whole';
ALTER TABLE metering_usagekey DROP CONSTRAINT metering_usagekey_pkey;
ALTER TABLE metering_usagekey ADD PRIMARY KEY (request_id, phase);
"""
BACKWARD = """
ALTER TABLE metering_usagekey DROP CONSTRAINT metering_usagekey_pkey;
DELETE FROM metering_usagekey WHERE phase <> 'whole';
ALTER TABLE metering_usagekey ADD PRIMARY KEY (request_id);
ALTER TABLE metering_usagekey DROP COLUMN phase;
ALTER TABLE metering_usageevent DROP CONSTRAINT metering_usageevent_pkey;
DELETE FROM metering_usageevent WHERE phase <> 'whole';
ALTER TABLE metering_usageevent ADD PRIMARY KEY (request_id, received_at);
ALTER TABLE metering_usageevent DROP COLUMN phase;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("metering", "0004_ledger_timing"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, reverse_sql=BACKWARD)],
            state_operations=[
                migrations.AddField(
                    model_name="usageevent",
                    name="phase",
                    field=models.CharField(choices=PHASES, default="whole", max_length=8),
                ),
                migrations.AddField(
                    model_name="usagekey",
                    name="phase",
                    field=models.CharField(choices=PHASES, default="whole", max_length=8),
                ),
            ],
        ),
    ]
