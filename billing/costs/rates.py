"""Dated cost rates: writing them (finance staff) and resolving them into
per-scope, per-hour arrays for the cost model.

A rate for one pool overrides the all-pools rate of its component where
both apply. A scenario's rates replace the booked rates of every component
the scenario prices, and leave the others as booked."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

import numpy as np
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.utils import timezone

from billing.choices import BASES_FOR, OVERHEAD_COMPONENTS, CostComponent, RateBasis
from billing.costs.closing import cost_change_check
from billing.costs.cost_model import HOUR, RateArrays
from billing.models import CostRate, CostScenario
from core.calendar import month_hours_array
from core.currencies import currency_is_iso
from core.locks import advisory_xact_lock
from core.nanos import NANO
from serving.models import Pool

# One writer of rates at a time, so two overlapping rows cannot both pass
# the overlap check.
RATES_LOCK = "billing_cost_rates"
# What is physically possible, in any currency's units (an energy tariff of
# 1,500 rupiah per kWh is real; 6e12 is a typo). A PUE is 1.0 (every watt
# reaches the GPUs) to 3.0 (the worst data centres measured).
RATE_CEILING = {
    RateBasis.PER_KWH: Decimal(10_000),
    RateBasis.RATIO: Decimal(3),
    RateBasis.PER_GPU_HOUR: Decimal(1_000_000),
    RateBasis.PER_GPU_MONTH: Decimal(1_000_000_000),
    RateBasis.PER_KW_MONTH: Decimal(1_000_000_000),
}
EDITABLE = ("amount", "basis", "effective_from", "effective_to", "hour_from", "hour_to", "note")


@dataclass(frozen=True)
class RateScope:
    """Where rates are resolved: a pool (or none, for GPUs no replica holds)."""

    pool_id: int | None
    label: str


def cost_rate_create(
    *,
    component: str,
    basis: str,
    amount: Decimal,
    effective_from: datetime,
    effective_to: datetime | None = None,
    pool: Pool | None = None,
    hour_from: int = 0,
    hour_to: int = 24,
    currency: str = "USD",
    scenario: CostScenario | None = None,
    note: str = "",
    user=None,
) -> CostRate:
    """A new dated rate. An open-ended rate of the same component and scope
    that began earlier is closed where this one begins (a rate change);
    any other overlap is refused, naming `effective_from`."""
    rate = CostRate(
        component=component,
        basis=basis,
        amount=amount,
        currency=currency,
        pool=pool,
        hour_from=hour_from,
        hour_to=hour_to,
        effective_from=effective_from,
        effective_to=effective_to,
        scenario=scenario,
        note=note,
        created_by=user,
    )
    with advisory_xact_lock(RATES_LOCK):
        superseded = cost_rate_check(rate)
        for old in superseded:
            old.effective_to = rate.effective_from
            old.save(update_fields=["effective_to"])
        rate.save()
    return rate


def cost_rate_check(rate: CostRate, *, now: datetime | None = None) -> list[CostRate]:
    """Raise what is wrong with a new or edited rate, naming the field (a
    booked rate taking effect in a closed period: CostPeriodClosedError);
    return the open rates it would close."""
    _validate(rate, now=now)
    if rate.scenario_id is None:
        cost_change_check(effective_from=rate.effective_from)
    overlapping = _overlapping(rate)
    superseded = [r for r in overlapping if rate.pk is None and _supersedes(rate, r)]
    clashes = [r for r in overlapping if r not in superseded]
    if clashes:
        raise ValidationError({"effective_from": _clash_message(clashes[0])})
    return superseded


def cost_rate_update(*, rate: CostRate, now: datetime | None = None, **changes) -> CostRate:
    """Edit a rate not yet in effect. One in effect (or past) never changes:
    a change from a date is a new rate from that date."""
    now = now or timezone.now()
    unknown = set(changes) - set(EDITABLE)
    if unknown:
        raise ValidationError({sorted(unknown)[0]: "cannot be changed; create a new rate"})
    with advisory_xact_lock(RATES_LOCK):
        rate = CostRate.objects.select_for_update().get(pk=rate.pk)
        if rate.effective_from <= now:
            raise ValidationError(
                {"effective_from": "this rate is already in effect; create a new rate instead"}
            )
        for name, value in changes.items():
            setattr(rate, name, value)
        cost_rate_check(rate, now=now)
        rate.save()
    return rate


def cost_rate_delete(*, rate: CostRate, now: datetime | None = None) -> None:
    """Withdraw a rate not yet in effect."""
    if rate.effective_from <= (now or timezone.now()):
        raise ValidationError(
            {"effective_from": "this rate is already in effect and stays in the history"}
        )
    rate.delete()


def _validate(rate: CostRate, *, now: datetime | None = None) -> None:
    if rate.component not in CostComponent.values:
        raise ValidationError({"component": f"must be one of {', '.join(CostComponent.values)}"})
    allowed = BASES_FOR[CostComponent(rate.component)]
    if rate.basis not in allowed:
        raise ValidationError(
            {"basis": f"{rate.component} is priced {' or '.join(allowed)}, not {rate.basis!r}"}
        )
    if rate.amount is None or rate.amount < 0:
        raise ValidationError({"amount": "must not be negative"})
    if rate.component == CostComponent.PUE and rate.amount < 1:
        raise ValidationError({"amount": "a PUE is at least 1"})
    basis = RateBasis(rate.basis)
    ceiling = RATE_CEILING[basis]
    if rate.amount > ceiling:
        if basis == RateBasis.RATIO:
            raise ValidationError({"amount": f"a PUE is at most {ceiling}"})
        unit = basis.label[0].lower() + basis.label[1:]  # "per kWh", "per GPU-month"
        raise ValidationError({"amount": f"at most {ceiling:,} {unit}"})
    if not currency_is_iso(rate.currency):
        raise ValidationError(
            {"currency": f"{rate.currency!r} is not an ISO 4217 currency code (e.g. USD, EUR)"}
        )
    if rate.effective_to is not None and rate.effective_to <= rate.effective_from:
        raise ValidationError({"effective_to": "must be after effective_from"})
    if now is not None and rate.effective_from <= now:
        raise ValidationError({"effective_from": "a rate can only be moved to a future date"})
    if not (0 <= rate.hour_from < rate.hour_to <= 24):
        raise ValidationError({"hour_to": "hours must satisfy 0 <= hour_from < hour_to <= 24"})
    if (rate.hour_from, rate.hour_to) != (0, 24) and rate.component != CostComponent.ENERGY:
        raise ValidationError({"hour_from": "only energy tariffs can vary by time of day"})
    if (
        rate.pool_id is not None
        and rate.scenario_id is None
        and not Pool.objects.filter(pk=rate.pool_id).exists()
    ):
        raise ValidationError({"pool": "unknown pool"})


def _overlapping(rate: CostRate) -> list[CostRate]:
    same = CostRate.objects.filter(
        component=rate.component,
        pool_id=rate.pool_id,
        scenario_id=rate.scenario_id,
        hour_from__lt=rate.hour_to,
        hour_to__gt=rate.hour_from,
    ).filter(Q(effective_to__isnull=True) | Q(effective_to__gt=rate.effective_from))
    if rate.effective_to is not None:
        same = same.filter(effective_from__lt=rate.effective_to)
    return list(same.exclude(pk=rate.pk).order_by("effective_from"))


def _supersedes(new: CostRate, old: CostRate) -> bool:
    return (
        old.effective_to is None
        and old.effective_from < new.effective_from
        and (old.hour_from, old.hour_to) == (new.hour_from, new.hour_to)
    )


def _clash_message(other: CostRate) -> str:
    until = f"{other.effective_to:%Y-%m-%d %H:%M}" if other.effective_to else "open-ended"
    return (
        f"overlaps rate {other.pk} ({other.component}, "
        f"{other.effective_from:%Y-%m-%d %H:%M} to {until}, "
        f"hours {other.hour_from}-{other.hour_to})"
    )


def rates_in_force(*, start: datetime, end: datetime, scenario: CostScenario | None):
    """The rate rows that price [start, end): booked, or a scenario's view."""
    booked = CostRate.objects.filter(scenario__isnull=True)
    window = Q(effective_from__lt=end) & (Q(effective_to__isnull=True) | Q(effective_to__gt=start))
    rows = list(booked.filter(window))
    if scenario is not None:
        own = list(CostRate.objects.filter(window, scenario=scenario))
        replaced = {r.component for r in own}
        rows = [r for r in rows if r.component not in replaced] + own
    return rows


def rate_arrays(
    *,
    rates: Sequence[CostRate],
    scopes: Sequence[RateScope],
    hours: np.ndarray,
    currencies: Iterable[str] = (),
) -> tuple[dict[str, RateArrays], list[str]]:
    """Resolve rates into (scope x hour) arrays, one set per currency of
    `currencies` and of the money rates (each set holding that currency's
    amounts only, zero where a rate in another currency is in force; the
    PUE, a ratio, in every set), and say what was missing."""
    per_month = month_hours_array(hours)

    def in_force(component: str) -> tuple[np.ndarray, np.ndarray]:
        """The amount in force per cell (NaN where none is) and its currency."""
        rows = [r for r in rates if r.component == component]
        chosen = _winning_rows(rows, scopes, hours)
        # Rates enter the vectorised model as floats; each GPU-hour is rounded once to 1e-9.
        values = np.array([float(r.amount) for r in rows] + [np.nan])  # ok-float
        currencies = np.array([r.currency for r in rows] + [""])
        return values[chosen], currencies[chosen]

    tariff, tariff_currency = in_force(CostComponent.ENERGY)
    pue, _ = in_force(CostComponent.PUE)
    warnings = _missing(tariff, scopes, "no energy tariff (energy costs nothing)")
    warnings += _missing(pue, scopes, "no PUE (1.0 assumed)")
    pue = np.where(np.isnan(pue), 1.0, pue)

    shape = (len(scopes), len(hours))
    money = [r for r in rates if r.component != CostComponent.PUE]
    per_gpu_hour = {c: np.zeros(shape) for c in {r.currency for r in money} | set(currencies)}
    per_kw_hour = {c: np.zeros(shape) for c in per_gpu_hour}
    for component in OVERHEAD_COMPONENTS:
        rows = [r for r in rates if r.component == component]
        chosen = _winning_rows(rows, scopes, hours)
        for i, rate in enumerate(rows):
            cells = chosen == i
            nano = float(rate.amount) * NANO  # ok-float: as above
            if rate.basis == RateBasis.PER_GPU_HOUR:
                per_gpu_hour[rate.currency][cells] += nano
            elif rate.basis == RateBasis.PER_GPU_MONTH:
                per_gpu_hour[rate.currency] += np.where(cells, nano / per_month[None, :], 0.0)
            else:
                per_kw_hour[rate.currency] += np.where(cells, nano / per_month[None, :], 0.0)

    arrays = {
        currency: RateArrays(
            tariff_nano_per_kwh=np.where(tariff_currency == currency, np.nan_to_num(tariff), 0.0)
            * NANO,
            pue=pue,
            nano_per_gpu_hour=per_gpu_hour[currency],
            nano_per_kw_hour=per_kw_hour[currency],
        )
        for currency in per_gpu_hour
    }
    return arrays, warnings


def _winning_rows(
    rows: Sequence[CostRate], scopes: Sequence[RateScope], hours: np.ndarray
) -> np.ndarray:
    """(scope x hour) index into `rows` of the rate in force, len(rows) where
    none is: each pool's own rates over the all-pools ones."""
    chosen = np.full((len(scopes), len(hours)), len(rows), dtype=np.int64)
    position = {scope.pool_id: i for i, scope in enumerate(scopes)}
    hour_of_day = (hours // HOUR) % 24
    order = sorted(range(len(rows)), key=lambda i: rows[i].pool_id is not None)
    for i in order:
        rate = rows[i]
        mask = (hours >= int(rate.effective_from.timestamp())) & (
            (hour_of_day >= rate.hour_from) & (hour_of_day < rate.hour_to)
        )
        if rate.effective_to is not None:
            mask &= hours < int(rate.effective_to.timestamp())
        if rate.pool_id is None:
            chosen[:, mask] = i
        elif rate.pool_id in position:
            chosen[position[rate.pool_id], mask] = i
    return chosen


def _missing(values: np.ndarray, scopes: Sequence[RateScope], what: str) -> list[str]:
    gaps = np.isnan(values).sum(axis=1)
    return [
        f"{scope.label}: {int(n)} hour(s) with {what}"
        for scope, n in zip(scopes, gaps, strict=True)
        if n
    ]
