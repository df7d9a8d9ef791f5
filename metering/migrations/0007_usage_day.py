"""Daily totals of the hourly rollups (metering.UsageDay), kept
by triggers on metering_usagerollup in the statement that writes the
rollups, so every writer (the rollup job, a test's ORM row, a bulk load in
SQL) keeps them equal to their hours. An invoice run sums a month's days
instead of its hours (a 24th of the rows)."""

import django.db.models.deletion
from django.db import migrations, models

# One function for the three statement triggers (transition tables allow
# one event per trigger): each statement's rows, subtracted (old) and added
# (new), summed per (day, tenant, model) and applied in key order. That
# orders the row locks within one statement only: writers of rollups whose
# transactions hold several statements (the rollup job, the synthetic
# history) take the metering run's lock, metering.jobs.RUN_LOCK. A day
# whose last hourly row went is deleted.
APPLY = """
CREATE FUNCTION metering_usageday_apply() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    changed text := CASE TG_OP
        WHEN 'INSERT' THEN 'SELECT 1 AS sign, * FROM new_rows'
        WHEN 'DELETE' THEN 'SELECT -1 AS sign, * FROM old_rows'
        ELSE 'SELECT -1 AS sign, * FROM old_rows UNION ALL SELECT 1, * FROM new_rows'
    END;
BEGIN
    EXECUTE format($sql$
        INSERT INTO metering_usageday AS d
            (day, tenant_id, served_model_id, prompt_tokens, cached_tokens,
             completion_tokens, device_seconds, rollup_rows)
        SELECT date_trunc('day', hour, 'UTC'), tenant_id, served_model_id,
               sum(sign * prompt_tokens), sum(sign * cached_tokens),
               sum(sign * completion_tokens), sum(sign * device_seconds), sum(sign)
        FROM (%s) r
        WHERE served_model_id IS NOT NULL
        GROUP BY 1, 2, 3
        ORDER BY 1, 2, 3
        ON CONFLICT (day, tenant_id, served_model_id) DO UPDATE SET
            prompt_tokens = d.prompt_tokens + EXCLUDED.prompt_tokens,
            cached_tokens = d.cached_tokens + EXCLUDED.cached_tokens,
            completion_tokens = d.completion_tokens + EXCLUDED.completion_tokens,
            device_seconds = d.device_seconds + EXCLUDED.device_seconds,
            rollup_rows = d.rollup_rows + EXCLUDED.rollup_rows
    $sql$, changed);
    IF TG_OP <> 'INSERT' THEN
        DELETE FROM metering_usageday d
        USING (SELECT DISTINCT date_trunc('day', hour, 'UTC') AS day, tenant_id, served_model_id
               FROM old_rows WHERE served_model_id IS NOT NULL) k
        WHERE d.rollup_rows = 0 AND d.day = k.day AND d.tenant_id = k.tenant_id
          AND d.served_model_id = k.served_model_id;
    END IF;
    RETURN NULL;
END
$fn$;

-- DELETE, not TRUNCATE: a TRUNCATE naming both tables (Django's flush)
-- holds the days while this runs.
CREATE FUNCTION metering_usageday_truncate() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM metering_usageday;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER usageday_insert AFTER INSERT ON metering_usagerollup
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION metering_usageday_apply();
CREATE TRIGGER usageday_update AFTER UPDATE ON metering_usagerollup
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION metering_usageday_apply();
CREATE TRIGGER usageday_delete AFTER DELETE ON metering_usagerollup
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION metering_usageday_apply();
CREATE TRIGGER usageday_truncate AFTER TRUNCATE ON metering_usagerollup
    FOR EACH STATEMENT EXECUTE FUNCTION metering_usageday_truncate();

INSERT INTO metering_usageday
    (day, tenant_id, served_model_id, prompt_tokens, cached_tokens,
     completion_tokens, device_seconds, rollup_rows)
SELECT date_trunc('day', hour, 'UTC'), tenant_id, served_model_id, sum(prompt_tokens),
       sum(cached_tokens), sum(completion_tokens), sum(device_seconds), count(*)
FROM metering_usagerollup
WHERE served_model_id IS NOT NULL
GROUP BY 1, 2, 3;
"""

UNAPPLY = """
DROP TRIGGER IF EXISTS usageday_truncate ON metering_usagerollup;
DROP TRIGGER IF EXISTS usageday_delete ON metering_usagerollup;
DROP TRIGGER IF EXISTS usageday_update ON metering_usagerollup;
DROP TRIGGER IF EXISTS usageday_insert ON metering_usagerollup;
DROP FUNCTION IF EXISTS metering_usageday_truncate();
DROP FUNCTION IF EXISTS metering_usageday_apply();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("metering", "0006_usagekey_no_pattern_index"),
        ("serving", "0006_disaggregated_pools"),
        ("tenants", "0006_policy_fair_queuing"),
    ]

    operations = [
        migrations.CreateModel(
            name="UsageDay",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("day", models.DateTimeField()),
                ("prompt_tokens", models.BigIntegerField(default=0)),
                ("cached_tokens", models.BigIntegerField(default=0)),
                ("completion_tokens", models.BigIntegerField(default=0)),
                (
                    "device_seconds",
                    models.DecimalField(decimal_places=9, default=0, max_digits=24),
                ),
                ("rollup_rows", models.BigIntegerField(default=0)),
                (
                    "served_model",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="serving.servedmodel",
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="tenants.tenant",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("day", "tenant", "served_model"), name="usageday_unique"
                    )
                ],
            },
        ),
        migrations.RunSQL(APPLY, reverse_sql=UNAPPLY),
    ]
