"""manage.py allocate refuses a bad period in one line naming the option
(a CommandError: exit status 1, no traceback) and writes no run."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from billing.models import AllocationRun

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["--start", "2026-10-05", "--end", "2026-10-05"],
            "--end: must be after start (asked for 2026-10-05 00:00:00 to 2026-10-05 00:00:00 UTC)",
        ),
        (
            ["--start", "2026-10-05", "--end", "2026-10-04T23:00"],
            "--end: must be after start (asked for 2026-10-05 00:00:00 to 2026-10-04 23:00:00 UTC)",
        ),
        (
            ["--start", "2026-10-05T00:30"],  # the default end, a day later, is not whole either
            "--start: must be a whole hour (UTC) "
            "(asked for 2026-10-05 00:30:00 to 2026-10-06 00:30:00 UTC)",
        ),
        (
            ["--start", "2026-10-05", "--end", "2026-10-05T01:00:30"],
            "--end: must be a whole hour (UTC)",
        ),
        (
            ["--start", "2026-13-01"],
            "argument --start: '2026-13-01' is not a date or time "
            "(use ISO 8601 in UTC, e.g. 2026-10-05 or 2026-10-05T14:00)",
        ),
        (["--start", "2026-10-05", "--end", "yesterday"], "argument --end: 'yesterday'"),
        (["--start", "9999-12-31"], "--start 9999-12-31: too late for the calendar"),
        (["--scenario", "no such"], "--scenario: no scenario named 'no such'"),
    ],
)
def test_a_bad_period_is_refused_in_one_line_and_nothing_is_written(args, said):
    with pytest.raises(CommandError) as refused:
        call_command("allocate", *args, stdout=StringIO(), stderr=StringIO())

    message = str(refused.value)
    assert said in message
    assert "\n" not in message and "ValidationError" not in message
    assert not AllocationRun.objects.exists()
