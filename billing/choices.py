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
