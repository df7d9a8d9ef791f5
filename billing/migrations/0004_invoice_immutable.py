"""A finalized invoice, its lines, its credit applications and credit notes
are immutable in the database itself: whatever writes to it (the ORM, the
admin, a SQL console), the change is refused. Status may still move on
(paid, void, uncollectible) and the Stripe bookkeeping may be filled in."""

from django.db import migrations

SQL = r"""
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
        NEW.usage_fingerprint::text, NEW.warnings::text)
       IS DISTINCT FROM
       (OLD.tenant_id, OLD.issuer_id, OLD.sequence, OLD.number, OLD.currency,
        OLD.period_start, OLD.period_end, OLD.total_minor, OLD.finalized_at, OLD.rated_at,
        OLD.usage_fingerprint::text, OLD.warnings::text)) THEN
    RAISE EXCEPTION 'invoice % is finalized: it cannot be changed (issue a credit note)', OLD.number
      USING ERRCODE = 'restrict_violation';
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER billing_invoice_guard BEFORE UPDATE OR DELETE ON billing_invoice
  FOR EACH ROW EXECUTE FUNCTION billing_invoice_guard();

-- Lines and credit applications belong to a draft or to nobody.
CREATE OR REPLACE FUNCTION billing_invoice_child_guard() RETURNS trigger AS $$
DECLARE
  parent_status text;
BEGIN
  SELECT status INTO parent_status FROM billing_invoice
   WHERE id = CASE WHEN TG_OP = 'DELETE' THEN OLD.invoice_id ELSE NEW.invoice_id END;
  IF parent_status IS NOT NULL AND parent_status <> 'draft' THEN
    RAISE EXCEPTION '% of a finalized invoice cannot be changed', TG_TABLE_NAME
      USING ERRCODE = 'restrict_violation';
  END IF;
  IF TG_OP = 'UPDATE' AND OLD.invoice_id <> NEW.invoice_id THEN
    SELECT status INTO parent_status FROM billing_invoice WHERE id = OLD.invoice_id;
    IF parent_status <> 'draft' THEN
      RAISE EXCEPTION '% of a finalized invoice cannot be moved', TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
    END IF;
  END IF;
  RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER billing_invoiceline_guard BEFORE INSERT OR UPDATE OR DELETE
  ON billing_invoiceline FOR EACH ROW EXECUTE FUNCTION billing_invoice_child_guard();
CREATE TRIGGER billing_creditapplication_guard BEFORE INSERT OR UPDATE OR DELETE
  ON billing_creditapplication FOR EACH ROW EXECUTE FUNCTION billing_invoice_child_guard();

-- A credit note is written once; only its Stripe id may be filled in.
CREATE OR REPLACE FUNCTION billing_creditnote_guard() RETURNS trigger AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    RAISE EXCEPTION 'credit note % cannot be deleted', OLD.number
      USING ERRCODE = 'restrict_violation';
  END IF;
  IF (NEW.invoice_id, NEW.issuer_id, NEW.sequence, NEW.number, NEW.reason, NEW.amount_minor,
      NEW.wallet_grant_id, NEW.created_at)
     IS DISTINCT FROM
     (OLD.invoice_id, OLD.issuer_id, OLD.sequence, OLD.number, OLD.reason, OLD.amount_minor,
      OLD.wallet_grant_id, OLD.created_at) THEN
    RAISE EXCEPTION 'credit note % cannot be changed', OLD.number
      USING ERRCODE = 'restrict_violation';
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER billing_creditnote_guard BEFORE UPDATE OR DELETE ON billing_creditnote
  FOR EACH ROW EXECUTE FUNCTION billing_creditnote_guard();
"""

REVERSE = r"""
DROP TRIGGER IF EXISTS billing_creditnote_guard ON billing_creditnote;
DROP TRIGGER IF EXISTS billing_creditapplication_guard ON billing_creditapplication;
DROP TRIGGER IF EXISTS billing_invoiceline_guard ON billing_invoiceline;
DROP TRIGGER IF EXISTS billing_invoice_guard ON billing_invoice;
DROP FUNCTION IF EXISTS billing_creditnote_guard();
DROP FUNCTION IF EXISTS billing_invoice_child_guard();
DROP FUNCTION IF EXISTS billing_invoice_guard();
"""


class Migration(migrations.Migration):
    dependencies = [("billing", "0003_invoices")]
    operations = [migrations.RunSQL(SQL, REVERSE)]
