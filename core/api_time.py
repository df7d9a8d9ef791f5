"""The span of time the API accepts: every datetime or date a request
carries (a period's start and end, an effective date, an as-of, an expiry)
lies within [SUPPORTED_FROM, SUPPORTED_UNTIL] (core.calendar).

Outside it the product cannot hold a period: "the period before" a
report of year 1 falls before year 1 (OverflowError), the ledger's monthly
partitions and the calendar maths assume a modern date, and PostgreSQL's
range is narrower than Python's. So a request for 0001-01-01 is a 400
naming its field, checked here for every serializer that takes time; the
services that take such a moment refuse it with the same message, so a
page's form says what the API says."""

from __future__ import annotations

from datetime import UTC, datetime

from rest_framework import serializers

from core.calendar import OUT_OF_RANGE, moment_supported


class SupportedDateTimeField(serializers.DateTimeField):
    """A DateTimeField that refuses moments outside the supported span
    (including those Python's datetime cannot even convert to UTC)."""

    default_error_messages = {"out_of_range": OUT_OF_RANGE, "overflow": OUT_OF_RANGE}

    def to_internal_value(self, value):
        moment = super().to_internal_value(value)
        if not moment_supported(moment):
            self.fail("out_of_range")
        return moment


class SupportedDateField(serializers.DateField):
    """A DateField that refuses days outside the supported span."""

    default_error_messages = {"out_of_range": OUT_OF_RANGE}

    def to_internal_value(self, value):
        day = super().to_internal_value(value)
        if not moment_supported(day):
            self.fail("out_of_range")
        return day


def utc_iso(moment: datetime) -> str:
    """`moment` as the API writes every timestamp, in JSON and CSV alike:
    ISO 8601 in UTC with a "Z" (2026-11-21T10:00:00Z), as DRF's
    DateTimeField writes it."""
    text = moment.astimezone(UTC).isoformat()
    return text.removesuffix("+00:00") + "Z"
