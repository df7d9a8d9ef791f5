"""The span of time the API accepts: every datetime or date a request
carries (a period's start and end, an effective date, an as-of, an expiry)
lies within [SUPPORTED_FROM, SUPPORTED_UNTIL].

Outside it the product cannot hold a period: "the period before" a
report of year 1 falls before year 1 (OverflowError), the ledger's monthly
partitions and the calendar maths assume a modern date, and PostgreSQL's
range is narrower than Python's. So a request for 0001-01-01 is a 400
naming its field, checked once here for every serializer that takes time."""

from __future__ import annotations

from datetime import UTC, datetime

from rest_framework import serializers

SUPPORTED_FROM = datetime(2000, 1, 1, tzinfo=UTC)
SUPPORTED_UNTIL = datetime(2100, 1, 1, tzinfo=UTC)
OUT_OF_RANGE = (
    f"must be between {SUPPORTED_FROM:%Y-%m-%d} and {SUPPORTED_UNTIL:%Y-%m-%d} (UTC), inclusive"
)


class SupportedDateTimeField(serializers.DateTimeField):
    """A DateTimeField that refuses moments outside the supported span
    (including those Python's datetime cannot even convert to UTC)."""

    default_error_messages = {"out_of_range": OUT_OF_RANGE, "overflow": OUT_OF_RANGE}

    def to_internal_value(self, value):
        moment = super().to_internal_value(value)
        if not SUPPORTED_FROM <= moment <= SUPPORTED_UNTIL:
            self.fail("out_of_range")
        return moment


class SupportedDateField(serializers.DateField):
    """A DateField that refuses days outside the supported span."""

    default_error_messages = {"out_of_range": OUT_OF_RANGE}

    def to_internal_value(self, value):
        day = super().to_internal_value(value)
        if not SUPPORTED_FROM.date() <= day <= SUPPORTED_UNTIL.date():
            self.fail("out_of_range")
        return day
