"""Revenue of a period, placed where it was earned: every tenant's rated
charges for [start, end) split over the (pool, model) rows of its usage,
in exact nano-units, so margin can be read per tier, pool, tenant and
model and every split adds back to the charge.

Token charges follow that kind of token, GPU-second charges the
device-seconds; a reservation fee goes to the reserved pools by reserved
GPU-hours, a dedicated fee to the tenant's dedicated pools by GPUs; the
plan's discount and commitment true-up follow the usage revenue.

Revenue is recognised by usage period (accrual). A commitment true-up is
a monthly figure: it counts only when the report's period is the
tenant's billing period.

SLA credits are revenue given back: those on the tenant's live invoices
(drafts included) of billing periods ending in the report's period are
taken off its revenue, following its revenue like the discount, and kept
beside it (`sla_credit`, positive) so reports show what was lost."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

import numpy as np
import pandas as pd
from django.db.models import Q

from billing.invoicing.selectors import sla_credits_by_tenant
from billing.money import from_minor
from billing.pricing.periods import tenants_by_period
from billing.pricing.rating import Charge, charges_compute, rating_inputs, rating_session
from core.nanos import to_nano
from metering.apportion import apportion
from metering.selectors.totals import usage_by_tenant_pool_model
from serving.choices import PoolKind
from serving.models import Gpu, Pool, Reservation, ServedModel
from tenants.models import Tenant

COLUMNS = ["tenant_id", "pool_id", "model", "revenue", "sla_credit"]
TOKEN_COLUMN = {"input": "input", "cached_input": "cached", "output": "completion"}


def revenue_rows(*, start: datetime, end: datetime) -> pd.DataFrame:
    """One row per (tenant, pool, model) with revenue, net of SLA credits,
    and the SLA credits, in nano-units; pool and model are None where a
    charge has no usage to follow."""
    usage = _usage(start=start, end=end)
    credits = sla_credits_by_tenant(start=start, end=end)
    tenants = Tenant.objects.filter(
        Q(pk__in=usage.keys())
        | Q(pk__in=credits.keys())
        | Q(reservations__start__lt=end, reservations__end__gt=start)
        | Q(pools__kind=PoolKind.DEDICATED)
        | Q(subscriptions__isnull=False)
    ).distinct()
    tenants = list(tenants)
    inputs = rating_inputs(tenants=tenants, start=start, end=end)
    # Tenants whose billing period is exactly this one keep their true-up.
    whole = tenants_by_period(tenants=tenants, moment=start, closed=False).get((start, end), [])
    rows: list[tuple] = []
    with rating_session():
        for tenant in tenants:
            charges = charges_compute(tenant=tenant, start=start, end=end, inputs=inputs[tenant.pk])
            if tenant not in whole:
                charges = [c for c in charges if c.kind != "commit_true_up"]
            lost = to_nano(from_minor(credits.get(tenant.pk, 0), tenant.billing_currency))
            rows += _place(
                tenant, charges, usage.get(tenant.pk, {}), start=start, end=end, sla_credit=lost
            )
    frame = pd.DataFrame(rows, columns=COLUMNS)
    return frame.groupby(["tenant_id", "pool_id", "model"], dropna=False, as_index=False).sum()


def _usage(*, start, end) -> dict[int, dict[tuple, dict[str, float]]]:  # ok-float: weights only
    """tenant -> (pool id, model name) -> token and device-second totals."""
    out: dict[int, dict[tuple, dict[str, float]]] = defaultdict(dict)  # ok-float: weights only
    rows = usage_by_tenant_pool_model(start=start, end=end)
    names = dict(ServedModel.objects.values_list("pk", "name"))  # cheaper than a join
    for row in rows:
        out[row["tenant_id"]][(row["pool_id"], names[row["served_model_id"]])] = {
            "input": float(row["prompt"] - row["cached"]),  # ok-float: weights only
            "cached": float(row["cached"]),  # ok-float: weights only
            "completion": float(row["completion"]),  # ok-float: weights only
            "seconds": float(row["seconds"]),  # ok-float: weights only
        }
    return out


def _place(
    tenant, charges: list[Charge], usage: dict, *, start, end, sla_credit: int = 0
) -> list[tuple]:
    placed: dict[tuple, int] = defaultdict(int)
    lost: dict[tuple, int] = defaultdict(int)
    later = []
    for charge in charges:
        amount = to_nano(charge.amount)
        if charge.kind == "tokens":
            weights = {
                key: w[TOKEN_COLUMN[charge.token_kind]]
                for key, w in usage.items()
                if key[1] == charge.model
            }
        elif charge.kind == "gpu_seconds":
            weights = {key: w["seconds"] for key, w in usage.items() if key[1] == charge.model}
        elif charge.kind == "reservation":
            weights = _reserved_gpu_hours(tenant, start, end)
        elif charge.kind == "dedicated":
            weights = _dedicated_gpus(tenant)
        else:  # discount, commitment true-up: after the rest, following it
            later.append(amount)
            continue
        _split(placed, amount, weights, fallback=(None, charge.model))
    earned = {key: float(v) for key, v in placed.items() if v > 0}  # ok-float: weights only
    for amount in later:
        _split(placed, amount, earned, fallback=(None, None))
    if sla_credit:
        _split(lost, sla_credit, earned, fallback=(None, None))
        for key, nano in lost.items():
            placed[key] -= nano
    return [
        (tenant.pk, pool, model, nano, lost.get((pool, model), 0))
        for (pool, model), nano in placed.items()
        if nano or lost.get((pool, model))
    ]


def _split(placed: dict, amount: int, weights: dict, *, fallback: tuple) -> None:
    weights = {key: w for key, w in weights.items() if w > 0}
    if not weights:
        placed[fallback] += amount
        return
    keys = list(weights)
    values = np.array([weights[k] for k in keys], dtype=np.float64)
    parts = apportion(values / values.sum() * abs(amount), total=abs(amount))
    for key, part in zip(keys, parts, strict=True):
        placed[key] += int(part) if amount >= 0 else -int(part)


def _reserved_gpu_hours(tenant, start, end) -> dict[tuple, float]:  # ok-float: weights only
    out: dict[tuple, float] = defaultdict(float)  # ok-float: weights only
    for r in Reservation.objects.filter(tenant=tenant, start__lt=end, end__gt=start):
        hours = (min(r.end, end) - max(r.start, start)).total_seconds() / 3600
        out[(r.pool_id, None)] += hours * r.gpu_count
    return out


def _dedicated_gpus(tenant) -> dict[tuple, float]:  # ok-float: weights only
    out: dict[tuple, float] = {}  # ok-float: weights only
    for pool in Pool.objects.filter(owner=tenant, kind=PoolKind.DEDICATED):
        gpus = Gpu.objects.filter(replicas__pool=pool).distinct().count()
        out[(pool.pk, None)] = float(gpus)  # ok-float: weights only
    return out
