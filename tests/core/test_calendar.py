"""Calendar maths in UTC: month starts and lengths (leap Februaries,
December into January), months added with the day clamped, anchored
monthly periods (anchor day 28), and time zones read in UTC, so daylight
saving never moves a boundary or changes a month's hours."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from zoneinfo import ZoneInfo

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.calendar import (
    day_ceil,
    day_start,
    epoch_hour,
    moment_epoch_hour,
    month_containing,
    month_hours,
    month_hours_array,
    month_start,
    month_starts_between,
    months_add,
    period_containing,
    period_last_closed,
    period_previous,
    utc_moment,
)

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("moment", "start"),
    [
        (utc(2024, 2, 29, 23, 59, 59, 999999), utc(2024, 2, 1)),
        (utc(2025, 12, 31, 23, 0), utc(2025, 12, 1)),
        (utc(2026, 1, 1), utc(2026, 1, 1)),
        # 01:30 in Berlin on April 1st is still March 31st in UTC.
        (datetime(2025, 4, 1, 1, 30, tzinfo=BERLIN), utc(2025, 3, 1)),
        (datetime(2025, 3, 31, 21, 0, tzinfo=NEW_YORK), utc(2025, 4, 1)),
        (datetime(2025, 7, 15, 12, 0), utc(2025, 7, 1)),  # naive: taken as UTC
        (date(2031, 3, 15), utc(2031, 3, 1)),
    ],
)
def test_month_start_is_the_first_instant_of_the_utc_month(moment, start):
    assert month_start(moment) == start
    assert month_start(moment).tzinfo is UTC


@pytest.mark.parametrize(
    ("moment", "months", "expected"),
    [
        (utc(2025, 12, 1), 1, utc(2026, 1, 1)),
        (utc(2026, 1, 1), -1, utc(2025, 12, 1)),
        (utc(2024, 1, 31, 6, 30), 1, utc(2024, 2, 29, 6, 30)),  # leap February
        (utc(2025, 1, 31), 1, utc(2025, 2, 28)),
        (utc(2025, 3, 31), -1, utc(2025, 2, 28)),
        (utc(2024, 3, 1), -13, utc(2023, 2, 1)),
        (date(2024, 2, 29), 12, date(2025, 2, 28)),
        (date(2023, 5, 31), 48, date(2027, 5, 31)),  # a GPU's useful life
        (date(2024, 8, 31), 1, date(2024, 9, 30)),
        (date(2025, 6, 15), 0, date(2025, 6, 15)),
    ],
)
def test_months_add_keeps_the_day_clamped_to_the_month(moment, months, expected):
    result = months_add(moment, months)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("moment", "hours"),
    [
        (utc(2024, 2, 10), Decimal(696)),  # leap February
        (utc(2025, 2, 10), Decimal(672)),
        (utc(2100, 2, 1), Decimal(672)),  # not a leap year
        (utc(2000, 2, 1), Decimal(696)),  # a leap year
        (utc(2025, 1, 31, 23), Decimal(744)),
        (utc(2025, 4, 1), Decimal(720)),
        (utc(2025, 12, 31, 23, 59), Decimal(744)),
        # Daylight saving changes in March and October (Europe, US): not in UTC.
        (datetime(2025, 3, 30, 12, tzinfo=BERLIN), Decimal(744)),
        (datetime(2025, 10, 26, 12, tzinfo=BERLIN), Decimal(744)),
        (datetime(2025, 11, 2, 12, tzinfo=NEW_YORK), Decimal(720)),
    ],
)
def test_month_hours(moment, hours):
    assert month_hours(moment) == hours
    assert month_containing(moment)[1] - month_containing(moment)[0] == timedelta(hours=int(hours))


def test_month_hours_array_agrees_with_month_hours_for_every_hour_of_a_leap_year():
    hours = np.arange(
        int(utc(2023, 12, 1).timestamp()), int(utc(2025, 2, 1).timestamp()), 3600, dtype=np.int64
    )
    vectorised = month_hours_array(hours)
    one_by_one = [float(month_hours(datetime.fromtimestamp(int(h), UTC))) for h in hours]
    assert vectorised.tolist() == one_by_one
    assert vectorised[0] == 744 and vectorised[-1] == 744
    february = int(utc(2024, 2, 29, 23).timestamp())
    assert vectorised[hours == february].tolist() == [696.0]


def test_month_starts_between_includes_an_end_that_is_one():
    assert month_starts_between(utc(2025, 11, 15, 8), utc(2026, 2, 1)) == [
        utc(2025, 11, 1),
        utc(2025, 12, 1),
        utc(2026, 1, 1),
        utc(2026, 2, 1),
    ]
    assert month_starts_between(utc(2025, 11, 15), utc(2026, 1, 31, 23)) == [
        utc(2025, 11, 1),
        utc(2025, 12, 1),
        utc(2026, 1, 1),
    ]
    assert month_starts_between(utc(2026, 1, 1), utc(2026, 1, 1)) == [utc(2026, 1, 1)]
    assert month_starts_between(utc(2026, 2, 1), utc(2026, 1, 1)) == []


def test_day_ceil_is_the_first_midnight_utc_at_or_after():
    assert day_ceil(utc(2024, 2, 29)) == utc(2024, 2, 29)
    assert day_ceil(utc(2024, 2, 29, 0, 0, 1)) == utc(2024, 3, 1)
    assert day_ceil(utc(2024, 12, 31, 23)) == utc(2025, 1, 1)
    tokyo = timezone(timedelta(hours=9))
    # 2024-03-01 08:00 in Tokyo is 23:00 UTC on the 29th of February.
    assert day_ceil(datetime(2024, 3, 1, 8, tzinfo=tokyo)) == utc(2024, 3, 1)


def test_a_moment_typed_on_a_command_line_is_read_in_utc():
    assert utc_moment("2026-10-01") == utc(2026, 10, 1)
    assert utc_moment("2026-10-01T05:30") == utc(2026, 10, 1, 5, 30)
    # An offset is kept as the moment it names, not replaced by UTC.
    assert utc_moment("2026-10-01T05:30+02:00") == utc(2026, 10, 1, 3, 30)
    assert utc_moment("2026-10-01T05:30+02:00").tzinfo is UTC


def test_day_start_is_midnight_utc():
    assert day_start(utc(2024, 2, 29, 23, 59)) == utc(2024, 2, 29)
    assert day_start(datetime(2025, 3, 30, 1, 30, tzinfo=BERLIN)) == utc(2025, 3, 30)
    assert day_start(datetime(2025, 3, 30, 0, 30, tzinfo=BERLIN)) == utc(2025, 3, 29)


@pytest.mark.parametrize(
    ("anchor", "moment", "period"),
    [
        (1, utc(2025, 12, 31, 23, 59), (utc(2025, 12, 1), utc(2026, 1, 1))),
        (1, utc(2026, 1, 1), (utc(2026, 1, 1), utc(2026, 2, 1))),
        (28, utc(2025, 3, 10), (utc(2025, 2, 28), utc(2025, 3, 28))),
        (28, utc(2025, 3, 27, 23, 59, 59), (utc(2025, 2, 28), utc(2025, 3, 28))),
        (28, utc(2025, 3, 28), (utc(2025, 3, 28), utc(2025, 4, 28))),
        (28, utc(2024, 2, 29, 12), (utc(2024, 2, 28), utc(2024, 3, 28))),
        (28, utc(2026, 1, 5), (utc(2025, 12, 28), utc(2026, 1, 28))),
        (15, utc(2025, 12, 20), (utc(2025, 12, 15), utc(2026, 1, 15))),
        # 00:30 on the 15th in Berlin is still the 14th in UTC: the period before.
        (15, datetime(2025, 6, 15, 0, 30, tzinfo=BERLIN), (utc(2025, 5, 15), utc(2025, 6, 15))),
        (
            15,
            datetime(2025, 6, 15, 2, 0, tzinfo=timezone(timedelta(hours=2))),
            (
                utc(2025, 6, 15),
                utc(2025, 7, 15),
            ),
        ),
    ],
)
def test_period_containing(anchor, moment, period):
    assert period_containing(anchor_day=anchor, moment=moment) == period


def test_previous_and_last_closed_periods():
    assert period_previous(anchor_day=28, start=utc(2025, 3, 28)) == (
        utc(2025, 2, 28),
        utc(2025, 3, 28),
    )
    assert period_previous(anchor_day=1, start=utc(2026, 1, 1)) == (
        utc(2025, 12, 1),
        utc(2026, 1, 1),
    )
    # Closed at or before `as_of`: a period ending exactly then counts.
    assert period_last_closed(anchor_day=10, as_of=utc(2025, 1, 10)) == (
        utc(2024, 12, 10),
        utc(2025, 1, 10),
    )
    assert period_last_closed(anchor_day=10, as_of=utc(2025, 1, 9, 23)) == (
        utc(2024, 11, 10),
        utc(2024, 12, 10),
    )


@pytest.mark.parametrize("anchor", [0, 29, 31])
def test_an_anchor_day_is_one_to_twenty_eight(anchor):
    with pytest.raises(ValueError, match="anchor day"):
        period_containing(anchor_day=anchor, moment=utc(2025, 5, 5))


@given(
    moment=st.datetimes(
        min_value=datetime(1990, 1, 1),
        max_value=datetime(2090, 1, 1),
        timezones=st.sampled_from([UTC, BERLIN, NEW_YORK]),
    ),
    anchor=st.integers(min_value=1, max_value=28),
)
def test_every_moment_lies_in_one_anchored_period_a_month_long(moment, anchor):
    start, end = period_containing(anchor_day=anchor, moment=moment)
    assert start <= moment < end
    assert start.day == end.day == anchor and start.tzinfo is end.tzinfo is UTC
    assert start.time() == end.time() == datetime.min.time()
    assert end == months_add(start, 1)
    assert period_containing(anchor_day=anchor, moment=end) == (end, months_add(end, 1))


@given(
    st.datetimes(
        min_value=datetime(1960, 1, 1),
        max_value=datetime(2100, 1, 1),
        timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), NEW_YORK]),
    )
)
def test_the_epoch_hour_of_a_moment_is_its_timestamps_in_any_zone(moment):
    assert moment_epoch_hour(moment) == epoch_hour(moment.timestamp())
