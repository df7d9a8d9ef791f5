"""Calendar maths, in UTC: days, months and monthly periods from an anchor
day (1-28), every span half-open [start, end). An aware datetime is read in
UTC (a naive one is taken to be UTC already); a `date` is a day of the UTC
calendar. Months are added with dateutil's relativedelta: the day is kept,
clamped to the month's last (Jan 31 + 1 month = Feb 28, or 29)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import TypeVar

import numpy as np
from dateutil.relativedelta import relativedelta

ANCHOR_DAYS = range(1, 29)  # a day every month has
_HOUR = timedelta(hours=1)
_DAY = timedelta(days=1)

Day = TypeVar("Day", bound=date)  # a date or a datetime, returned as given


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# The span of time the product takes as input (a period, an as-of, an
# effective date, an expiry), inclusive. Outside it the calendar maths
# fail ("the period before" one in year 1 is before year 1: OverflowError),
# the ledger's monthly partitions and PostgreSQL's range do not reach.
# Every service that takes such a moment refuses one outside it, naming
# the field, with OUT_OF_RANGE; the API's time fields say the same.
SUPPORTED_FROM = datetime(2000, 1, 1, tzinfo=UTC)
SUPPORTED_UNTIL = datetime(2100, 1, 1, tzinfo=UTC)
OUT_OF_RANGE = (
    f"must be between {SUPPORTED_FROM:%Y-%m-%d} and {SUPPORTED_UNTIL:%Y-%m-%d} (UTC), inclusive"
)


def moment_supported(moment: date | datetime) -> bool:
    """Whether `moment` (a naive datetime read as UTC, a date as its
    00:00 UTC) lies within [SUPPORTED_FROM, SUPPORTED_UNTIL]."""
    if not isinstance(moment, datetime):
        return SUPPORTED_FROM.date() <= moment <= SUPPORTED_UNTIL.date()
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return SUPPORTED_FROM <= moment <= SUPPORTED_UNTIL


def epoch_hour(seconds: float) -> int:  # ok-float: epoch seconds
    """Whole hours since the epoch, floored: an hour as an integer (exact
    for any moment this project stores: a float holds its seconds to well
    under a microsecond)."""
    return int(seconds // 3600)


_EPOCH_ORDINAL_HOURS = _EPOCH.toordinal() * 24


def moment_epoch_hour(moment: datetime) -> int:
    """epoch_hour of an aware datetime: from its calendar fields when it is
    in UTC (a quarter of the time `timestamp()` takes; the ingest path's
    stale marks take three a row), else from its timestamp."""
    if moment.tzinfo is UTC:
        return moment.toordinal() * 24 + moment.hour - _EPOCH_ORDINAL_HOURS
    return epoch_hour(moment.timestamp())


def epoch_hour_start(hour: int) -> datetime:
    """The moment (UTC) epoch hour `hour` starts."""
    return _EPOCH + timedelta(hours=hour)


def utc_moment(value: str) -> datetime:
    """An ISO 8601 date or time as typed on a command line: a naive one is
    read as UTC, one with an offset moved to UTC."""
    moment = datetime.fromisoformat(value)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _in_utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def hour_start(moment: datetime) -> datetime:
    """The start (UTC) of the UTC hour `moment` falls in."""
    return _in_utc(moment).replace(minute=0, second=0, microsecond=0)


def day_start(moment: datetime) -> datetime:
    """Midnight (UTC) of the UTC day `moment` falls on."""
    return _in_utc(moment).replace(hour=0, minute=0, second=0, microsecond=0)


def day_ceil(moment: datetime) -> datetime:
    """The first UTC midnight at or after `moment`."""
    start = day_start(moment)
    return start if start == _in_utc(moment) else start + _DAY


def period_text(start: datetime, end: datetime) -> str:
    """[start, end) as a person reads it, in UTC, end excluded: days alone
    when both ends are midnights ("2026-11-01 to 2026-11-24"), else with
    the times ("2026-12-01 00:00 to 20:00", the day once when both fall on
    it), so that 20 hours of a day never read as an empty day."""
    start, end = _in_utc(start), _in_utc(end)
    if start == day_start(start) and end == day_start(end):
        return f"{start:%Y-%m-%d} to {end:%Y-%m-%d}"
    if start.date() == end.date():
        return f"{start:%Y-%m-%d %H:%M} to {end:%H:%M}"
    return f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M}"


def month_start(moment: date | datetime) -> datetime:
    """The first instant (00:00 UTC on the 1st) of the UTC month of `moment`."""
    if not isinstance(moment, datetime):
        return datetime(moment.year, moment.month, 1, tzinfo=UTC)
    return _in_utc(moment).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def months_add(moment: Day, months: int) -> Day:
    """`moment` `months` calendar months later (earlier when negative), the
    day clamped to the month's last; the time of day and zone are kept."""
    return moment + relativedelta(months=months)


def month_containing(moment: date | datetime) -> tuple[datetime, datetime]:
    """The UTC calendar month of `moment`, [its 1st, the next month's 1st)."""
    start = month_start(moment)
    return start, months_add(start, 1)


def month_hours(moment: date | datetime) -> Decimal:
    """How many hours the UTC month of `moment` has (672 to 744; UTC has no
    daylight saving, so March and October are whole days too)."""
    start, end = month_containing(moment)
    return Decimal((end - start) // _HOUR)


def month_hours_array(epoch_seconds: np.ndarray) -> np.ndarray:
    """`month_hours` of each of an array of epoch seconds (UTC), vectorised,
    as floats."""
    months = epoch_seconds.astype("datetime64[s]").astype("datetime64[M]")
    length = (months + 1).astype("datetime64[s]") - months.astype("datetime64[s]")
    return length.astype(np.int64) / int(_HOUR.total_seconds())


def month_starts_between(start: date | datetime, end: datetime) -> list[datetime]:
    """The first instant of each month from `start`'s up to `end` (`end`
    itself included when it is one)."""
    months, moment = [], month_start(start)
    while moment <= end:
        months.append(moment)
        moment = months_add(moment, 1)
    return months


def period_containing(*, anchor_day: int, moment: datetime) -> tuple[datetime, datetime]:
    """The monthly period that holds `moment`: from 00:00 UTC on its
    `anchor_day` (1-28) to the same day a month later. Anchor day 1 is the
    calendar month."""
    if anchor_day not in ANCHOR_DAYS:
        raise ValueError(f"an anchor day is 1 to 28, not {anchor_day}")
    moment = _in_utc(moment)
    start = datetime(moment.year, moment.month, anchor_day, tzinfo=UTC)
    if moment < start:
        start = months_add(start, -1)
    return start, months_add(start, 1)


def period_previous(*, anchor_day: int, start: datetime) -> tuple[datetime, datetime]:
    """The period just before the one starting at `start`."""
    return period_containing(anchor_day=anchor_day, moment=start - _DAY)


def period_last_closed(*, anchor_day: int, as_of: datetime) -> tuple[datetime, datetime]:
    """The latest period that ended at or before `as_of`."""
    current_start, _ = period_containing(anchor_day=anchor_day, moment=as_of)
    return period_previous(anchor_day=anchor_day, start=current_start)
