"""Enumerations of the cost model, allocation and billing."""

from django.db import models


class CostComponent(models.TextChoices):
    """What a dated cost rate prices. Energy is priced per kWh (by time of
    day if need be) and scaled by the PUE; the rest are overheads per
    GPU-month, per kW-month of busy power, or per GPU-hour."""

    ENERGY = "energy", "Energy tariff"
    PUE = "pue", "Power usage effectiveness"
    COLOCATION = "colocation", "Colocation"
    NETWORK = "network", "Network"
    SUPPORT = "support", "Support"
    STAFF = "staff", "Staff overhead"


OVERHEAD_COMPONENTS = (
    CostComponent.COLOCATION,
    CostComponent.NETWORK,
    CostComponent.SUPPORT,
    CostComponent.STAFF,
)


class RateBasis(models.TextChoices):
    PER_KWH = "per_kwh", "Per kWh"
    RATIO = "ratio", "Ratio (no unit)"
    PER_GPU_MONTH = "per_gpu_month", "Per GPU-month"
    PER_KW_MONTH = "per_kw_month", "Per kW-month (busy power)"
    PER_GPU_HOUR = "per_gpu_hour", "Per GPU-hour"


BASES_FOR = {
    CostComponent.ENERGY: (RateBasis.PER_KWH,),
    CostComponent.PUE: (RateBasis.RATIO,),
    **{
        c: (RateBasis.PER_GPU_MONTH, RateBasis.PER_KW_MONTH, RateBasis.PER_GPU_HOUR)
        for c in OVERHEAD_COMPONENTS
    },
}


class RunStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class TokenKind(models.TextChoices):
    """What a token price applies to. Input excludes the cached part of the
    prompt, which has its own (usually lower) price."""

    INPUT = "input", "Input tokens"
    CACHED_INPUT = "cached_input", "Cached input tokens"
    OUTPUT = "output", "Output tokens"


class InvoiceStatus(models.TextChoices):
    """An invoice's life: a draft may be rebuilt; a finalized one never
    changes again, except to move on to paid, void or uncollectible."""

    DRAFT = "draft", "Draft"
    FINALIZED = "finalized", "Finalized (open)"
    PAID = "paid", "Paid"
    VOID = "void", "Void"
    UNCOLLECTIBLE = "uncollectible", "Uncollectible"


# Where each status may go next (the webhook and the finance API both obey it).
INVOICE_TRANSITIONS = {
    InvoiceStatus.DRAFT: {InvoiceStatus.FINALIZED},
    InvoiceStatus.FINALIZED: {InvoiceStatus.PAID, InvoiceStatus.VOID, InvoiceStatus.UNCOLLECTIBLE},
    InvoiceStatus.UNCOLLECTIBLE: {InvoiceStatus.PAID, InvoiceStatus.VOID},
    InvoiceStatus.PAID: set(),
    InvoiceStatus.VOID: set(),
}


# What the finance API may move an invoice to.
INVOICE_TARGET_STATUSES = [
    (s.value, s.label)
    for s in (
        InvoiceStatus.FINALIZED,
        InvoiceStatus.PAID,
        InvoiceStatus.VOID,
        InvoiceStatus.UNCOLLECTIBLE,
    )
]


class LineKind(models.TextChoices):
    TOKENS = "tokens", "Tokens"
    GPU_SECONDS = "gpu_seconds", "GPU-seconds"
    RESERVATION = "reservation", "Reserved GPUs"
    DEDICATED = "dedicated", "Dedicated GPUs"
    DISCOUNT = "discount", "Discount"
    COMMIT_TRUE_UP = "commit_true_up", "Minimum commitment true-up"
    CREDIT = "credit", "Prepaid credit applied"
    SLA_CREDIT = "sla_credit", "SLA credit"


class StripeSync(models.TextChoices):
    NOT_SYNCED = "not_synced", "Not synced (Stripe not configured)"
    PENDING = "pending", "Waiting to sync"
    SYNCED = "synced", "Synced"
    FAILED = "failed", "Sync failed (will retry)"


class ReportKind(models.TextChoices):
    FLASH = "flash", "Weekly flash"
    CLOSE = "close", "Monthly close"
    ADHOC = "adhoc", "On request"
    MONTH_TO_DATE = "mtd", "Month to date"


class SloMetric(models.TextChoices):
    """What an SLO promises, measured per tenant from the ledger: the
    share of requests that did not fail for a platform cause, and the 95th
    percentile of time to first token and of inter-token latency."""

    AVAILABILITY = "availability", "Availability"
    TTFT_P95 = "ttft_p95", "Time to first token, p95"
    ITL_P95 = "itl_p95", "Inter-token latency, p95"


class SlaAdjustmentAction(models.TextChoices):
    """What finance decided about an SLA credit on a draft invoice."""

    WAIVE = "waive", "Waived"
    ADJUST = "adjust", "Adjusted"
