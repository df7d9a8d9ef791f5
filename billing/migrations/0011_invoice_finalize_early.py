"""Finalizing early: an invoice finalized before its billing period ended
records who asked and why (immutable like the rest of a finalized
invoice: the guard of migration 0004 now covers these columns too), and
an invoice run asked to finalize early keeps the reason for the invoices
it finalizes."""

from django.db import migrations, models

GUARD = r"""
CREATE OR REPLACE FUNCTION billing_invoice_guard() RETURNS trigger AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    IF OLD.status <> 'draft' THEN
      RAISE EXCEPTION 'invoice % is finalized: it cannot be deleted', OLD.number
        USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN OLD;
  END IF;
  IF OLD.status <> 'draft' AND (
       NEW.status = 'draft'
    OR (NEW.tenant_id, NEW.issuer_id, NEW.sequence, NEW.number, NEW.currency,
        NEW.period_start, NEW.period_end, NEW.total_minor, NEW.finalized_at, NEW.rated_at,
        NEW.usage_fingerprint::text, NEW.warnings::text{new})
       IS DISTINCT FROM
       (OLD.tenant_id, OLD.issuer_id, OLD.sequence, OLD.number, OLD.currency,
        OLD.period_start, OLD.period_end, OLD.total_minor, OLD.finalized_at, OLD.rated_at,
        OLD.usage_fingerprint::text, OLD.warnings::text{old})) THEN
    RAISE EXCEPTION 'invoice % is finalized: it cannot be changed (issue a credit note)', OLD.number
      USING ERRCODE = 'restrict_violation';
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
"""
WITH_EARLY = GUARD.replace(
    "{new}", ",\n        NEW.finalized_early_by, NEW.finalized_early_reason"
).replace("{old}", ",\n        OLD.finalized_early_by, OLD.finalized_early_reason")
WITHOUT_EARLY = GUARD.replace("{new}", "").replace("{old}", "")


class Migration(migrations.Migration):
    dependencies = [("billing", "0010_fx_rates")]

    operations = [
        migrations.AddField(
            model_name="invoice",
            name="finalized_early_by",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
        migrations.AddField(
            model_name="invoice",
            name="finalized_early_reason",
            field=models.CharField(blank=True, default="", max_length=300),
        ),
        migrations.AddField(
            model_name="invoicerun",
            name="finalize_early_by",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
        migrations.AddField(
            model_name="invoicerun",
            name="finalize_early_reason",
            field=models.CharField(blank=True, default="", max_length=300),
        ),
        migrations.AddConstraint(
            model_name="invoice",
            constraint=models.CheckConstraint(
                condition=models.Q(finalized_early_reason="") | models.Q(sequence__isnull=False),
                name="invoice_early_only_when_numbered",
            ),
        ),
        migrations.AddConstraint(
            model_name="invoicerun",
            constraint=models.CheckConstraint(
                condition=models.Q(finalize_early_reason="") | models.Q(finalize=True),
                name="invoicerun_early_only_when_finalizing",
            ),
        ),
        migrations.RunSQL(WITH_EARLY, WITHOUT_EARLY),
    ]
