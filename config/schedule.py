"""The one place that declares what Celery beat runs and when. The database
scheduler (django-celery-beat) loads these entries at start; operators can
pause or retime them in the admin."""

from celery.schedules import crontab

BEAT_SCHEDULE = {
    "replicas-scrape": {"task": "serving.replicas_scrape", "schedule": 15.0},
    "metering-run": {"task": "metering.run", "schedule": 60.0},
    "metering-partitions": {"task": "metering.partitions_ensure", "schedule": 6 * 3600.0},
    "metering-conservation": {"task": "metering.conservation_check", "schedule": 3600.0},
    "metering-reconcile": {"task": "metering.reconcile", "schedule": crontab(minute=10)},
    # The scaled path's raw-event store: closed hours compacted, unreferenced
    # files vacuumed (a no-op on the ledger's path).
    "metering-store-maintain": {"task": "metering.store_maintain", "schedule": crontab(minute=20)},
    # After the last hour of yesterday is rolled up (metering runs every minute).
    "billing-allocation-daily": {
        "task": "billing.allocation_daily",
        "schedule": crontab(hour=0, minute=30),
    },
    # After the day's invoices: closed periods re-rated reproduce what was billed.
    "billing-reproduction-check": {
        "task": "billing.reproduction_check",
        "schedule": crontab(hour=4, minute=0),
    },
    # Monthly per tenant: each day invoices the tenants whose period ended.
    "billing-invoice-daily": {
        "task": "billing.invoice_daily",
        "schedule": crontab(hour=2, minute=0),
    },
    # After the week's / month's allocation (00:30) and invoices (02:00).
    "billing-margin-flash": {
        "task": "billing.margin_report_scheduled",
        "schedule": crontab(day_of_week="mon", hour=3, minute=0),
        "args": ("flash",),
    },
    # The finance overview's figures: this month so far, each night.
    "billing-margin-month-to-date": {
        "task": "billing.margin_report_scheduled",
        "schedule": crontab(hour=3, minute=30),
        "args": ("mtd",),
    },
    # The plan (demand forecasts), beside the weekly flash.
    "planning-plan-weekly": {
        "task": "planning.plan_weekly",
        "schedule": crontab(day_of_week="mon", hour=3, minute=15),
    },
    "billing-margin-close": {
        "task": "billing.margin_report_scheduled",
        "schedule": crontab(day_of_month="2", hour=4, minute=0),
        "args": ("close",),
    },
    "billing-budgets-check": {"task": "billing.budgets_check", "schedule": 60.0},
    # The gateways' spend counters corrected from the ledger.
    "billing-spend-correct": {"task": "billing.spend_correct", "schedule": 300.0},
    "billing-stripe-sweep": {"task": "billing.stripe_sweep", "schedule": 300.0},
    # Webhook deliveries whose task was never queued or was lost.
    "webhooks-deliveries-due": {"task": "webhooks.deliveries_due", "schedule": 60.0},
    # Runs whose worker died marked failed, not left "running".
    "billing-runs-abandoned": {"task": "billing.runs_abandoned", "schedule": 300.0},
    "planning-runs-abandoned": {"task": "planning.runs_abandoned", "schedule": 300.0},
    # The daily totals invoices read, checked against their hours before
    # the invoice run (02:00).
    "metering-usage-days-check": {
        "task": "metering.usage_days_check",
        "schedule": crontab(hour=1, minute=45),
    },
    # The raw ledger's months past the retention horizon, archived and
    # dropped early in the month, after the month's invoices and close.
    "metering-ledger-archive": {
        "task": "metering.ledger_archive",
        "schedule": crontab(day_of_month="3", hour=5, minute=0),
    },
    # slo.breached for yesterday's missed service levels (webhooks, email).
    "billing-slo-breaches": {
        "task": "billing.slo_breaches",
        "schedule": crontab(hour=0, minute=40),
    },
    # The audit trail's months past the same horizon, archived and removed.
    "audit-archive": {
        "task": "audit.archive",
        "schedule": crontab(day_of_month="3", hour=5, minute=30),
    },
    "billing-allocation-check": {
        "task": "billing.allocation_check",
        "schedule": crontab(hour=1, minute=30),
    },
}
