"""Converting money into the reporting currency (settings.REPORTING_CURRENCY)
at dated FX rates (FxRate rows), for margin reports and the finance pages.

Which rate. Revenue is rated per period (volume tiers and discounts apply
to the whole period), not per day, so an amount in another currency is
converted at the period's average rate: the mean of the daily rates over
the days of the usage period, each day weighted by the hours of it inside
the period, quantized to 12 places (ROUND_HALF_EVEN). That is the average
rate IAS 21 allows for income when rates do not swing wildly, and each
report lists the rate it used for each pair and period.

A day's rate is the rate stored for that day or, when there is none
(reference rates are published on business days only: weekends,
holidays), the latest of the LOOKBACK_DAYS days before. No rate in that
window: FxRateMissingError naming the pair and the day; never 1:1.

Derived rates, for a day: the pair as stored (EUR/USD); else the stored
reverse pair inverted (USD/EUR = 1 / EUR/USD); else a cross through a
currency both are quoted against on that day (GBP/USD = EUR/USD / EUR/GBP,
EUR preferred, since the ECB's reference rates are all against it).

Amounts are integer nano-units: an amount is converted once, rounded
half-even to a nano-unit, and totals are sums of converted amounts, so
margin = revenue - cost holds exactly after conversion."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

from django.conf import settings
from django.db.models import Q

from billing.errors import FxRateMissingError
from billing.models import FxRate

LOOKBACK_DAYS = 7
RATE_PLACES = Decimal("0.000000000001")  # 12 places, as stored
PIVOT = "EUR"
METHOD = "average of daily rates over the usage period"
_DAY = timedelta(days=1)


def reporting_currency() -> str:
    return settings.REPORTING_CURRENCY


@dataclass(frozen=True)
class FxConversion:
    """The rate one period's amounts in `base` were converted at."""

    base: str
    quote: str
    start: datetime
    end: datetime
    rate: Decimal
    days: int
    derived: str  # how the daily rates were found: direct, inverse, cross via X

    def as_json(self) -> dict:
        return {
            "pair": f"{self.base}/{self.quote}",
            "base": self.base,
            "quote": self.quote,
            "period_start": self.start.isoformat(),
            "period_end": self.end.isoformat(),
            "rate": f"{self.rate:f}",
            "days": self.days,
            "method": METHOD,
            "derived": self.derived,
        }


def fx_convert_nano(nano: int, rate: Decimal) -> int:
    """An amount in nano-units of one currency in nano-units of another,
    rounded once, half to even."""
    return int((Decimal(int(nano)) * rate).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def fx_period_rate(*, base: str, quote: str, start: datetime, end: datetime) -> FxConversion:
    """The average rate of [start, end) for base -> quote (see the module)."""
    days = _days(start, end)
    table = FxTable.load(currencies={base, quote}, first=days[0][0], last=days[-1][0])
    return table.period_rate(base=base, quote=quote, start=start, end=end)


def _days(start: datetime, end: datetime) -> list[tuple[date, int]]:
    """Each UTC day overlapping [start, end) with the seconds of it inside."""
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    out, day = [], start.date()
    while True:
        day_start = datetime.combine(day, time(), tzinfo=UTC)
        if day_start >= end:
            break
        seconds = (min(end, day_start + _DAY) - max(start, day_start)).total_seconds()
        if seconds > 0:
            out.append((day, int(seconds)))
        day += _DAY
    return out


class FxTable:
    """The stored rates involving some currencies over some days, read in
    one query, resolving any pair on any day as the module describes."""

    def __init__(self, rows: list[tuple[str, str, date, Decimal]]) -> None:
        self.rates: dict[tuple[str, str, date], Decimal] = {}
        self.quoted: dict[tuple[str, date], set[str]] = defaultdict(set)
        for base, quote, day, rate in rows:
            self.rates[(base, quote, day)] = rate
            self.quoted[(base, day)].add(quote)
            self.quoted[(quote, day)].add(base)

    @classmethod
    def load(cls, *, currencies: set[str], first: date, last: date) -> FxTable:
        rows = FxRate.objects.filter(
            Q(base__in=currencies) | Q(quote__in=currencies),
            date__gte=first - timedelta(days=LOOKBACK_DAYS),
            date__lte=last,
        ).values_list("base", "quote", "date", "rate")
        return cls(list(rows))

    def period_rate(self, *, base: str, quote: str, start: datetime, end: datetime):
        total = weighted = Decimal(0)
        how: set[str] = set()
        days = _days(start, end)
        for day, seconds in days:
            rate, derived = self.day_rate(base=base, quote=quote, day=day)
            weighted += rate * seconds
            total += seconds
            how.add(derived)
        rate = (weighted / total).quantize(RATE_PLACES, rounding=ROUND_HALF_EVEN)
        return FxConversion(base, quote, start, end, rate, len(days), ", ".join(sorted(how)))

    def day_rate(self, *, base: str, quote: str, day: date) -> tuple[Decimal, str]:
        if base == quote:
            return Decimal(1), "same currency"
        for back in range(LOOKBACK_DAYS + 1):
            found = self._on(base, quote, day - timedelta(days=back))
            if found is not None:
                return found
        raise FxRateMissingError(base, quote, day, LOOKBACK_DAYS)

    def _leg(self, base: str, quote: str, day: date) -> Decimal | None:
        if (rate := self.rates.get((base, quote, day))) is not None:
            return rate
        if (rate := self.rates.get((quote, base, day))) is not None:
            return 1 / rate
        return None

    def _on(self, base: str, quote: str, day: date) -> tuple[Decimal, str] | None:
        if (rate := self.rates.get((base, quote, day))) is not None:
            return rate, "direct"
        if (rate := self.rates.get((quote, base, day))) is not None:
            return 1 / rate, "inverse"
        pivots = (self.quoted[(base, day)] & self.quoted[(quote, day)]) - {base, quote}
        for pivot in sorted(pivots, key=lambda c: (c != PIVOT, c)):
            there, back = self._leg(base, pivot, day), self._leg(pivot, quote, day)
            if there is not None and back is not None:
                return there * back, f"cross via {pivot}"
        return None
