"""The audit trail's rows. Written only by the triggers of audit.triggers;
the database refuses to change or delete them."""

from django.contrib.postgres.fields import ArrayField
from django.db import models

from audit.choices import Action, Via


class AuditEntry(models.Model):
    """One row of an audited table created, changed or deleted: when, by
    whom, from where, and the row before and after (secrets left out).
    `tenant_id` is the tenant the row belongs to, when it belongs to one: a
    tenant's owners see those entries. No foreign keys: an entry outlives
    what it describes."""

    at = models.DateTimeField()
    table = models.CharField(max_length=63)
    row_id = models.CharField(max_length=64)
    action = models.CharField(max_length=8, choices=Action.choices)
    changed = ArrayField(models.CharField(max_length=63), null=True, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    tenant_id = models.BigIntegerField(null=True, blank=True)
    actor = models.CharField(max_length=200)
    actor_user_id = models.BigIntegerField(null=True, blank=True)
    via = models.CharField(max_length=16, choices=Via.choices)
    request = models.CharField(max_length=300, blank=True, default="")
    transaction_id = models.BigIntegerField()

    class Meta:
        indexes = [
            models.Index(fields=["at"], name="audit_at"),
            models.Index(fields=["tenant_id", "at"], name="audit_tenant_at"),
            models.Index(fields=["table", "row_id"], name="audit_table_row"),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.table}#{self.row_id}"


class AuditLink(models.Model):
    """The hash chain over the entries (audit.chain): one link per entry,
    in commit order, made by a trigger and never changed or removed."""

    seq = models.BigIntegerField(primary_key=True)
    entry_id = models.BigIntegerField(unique=True)
    hash = models.BinaryField()

    def __str__(self) -> str:
        return f"link {self.seq}: entry {self.entry_id}"


class AuditArchive(models.Model):
    """A month of audit entries past the retention horizon, written to a
    Parquet file, read back and verified, then removed from the table (the
    ledger's rule, metering.archive). Kept forever."""

    month = models.DateField(unique=True)
    url = models.CharField(max_length=500)
    rows = models.BigIntegerField()
    first_id = models.BigIntegerField(null=True)
    last_id = models.BigIntegerField(null=True)
    sha256 = models.CharField(max_length=64)
    archived_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"audit {self.month:%Y-%m}: {self.rows} entries"
