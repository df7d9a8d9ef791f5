from django.apps import AppConfig
from django.core import checks
from django.db.models.signals import post_migrate


class MeteringConfig(AppConfig):
    """The usage ledger, attribution of device-seconds, rollups and exports."""

    name = "metering"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        post_migrate.connect(_partitions_after_migrate, sender=self)
        checks.register(_retention_long_enough)


def _retention_long_enough(**kwargs) -> list[checks.CheckMessage]:
    """Every process refuses to start with a horizon that would archive
    usage billing still reads (metering.retention)."""
    from metering.retention import RetentionTooShort, retention_months

    try:
        retention_months()
    except RetentionTooShort as short:
        return [checks.Error(str(short), id="metering.E001")]
    return []


def _partitions_after_migrate(*, using: str, **kwargs) -> None:
    """A database just migrated has its ledger partitions for last month to
    three ahead, as the beat keeps them (metering.partitions_ensure): the
    first events of a new deployment go straight in, with no failed COPY
    in PostgreSQL's log before ingestion creates the month."""
    from django.db import connections
    from django.utils import timezone

    from metering.partitions import LEDGER_TABLE, usage_partitions_ensure_ahead

    with connections[using].cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [LEDGER_TABLE])
        if cursor.fetchone()[0] is None:  # migrated back past the ledger
            return
    usage_partitions_ensure_ahead(now=timezone.now())
