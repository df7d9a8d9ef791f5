"""Form fields the dashboard pages of every app share."""

from __future__ import annotations

from datetime import UTC, date, datetime

from django import forms

from core.calendar import OUT_OF_RANGE, moment_supported

DAY_NEEDED = "a day as YYYY-MM-DD is needed"


class UtcDayField(forms.Field):
    """A day typed as YYYY-MM-DD, cleaned to that day's 00:00 UTC; empty is
    None when the field is optional. Anything else, or nothing when the
    day is required, is refused with one message; a day outside the
    supported span (core.calendar) with the API's."""

    default_error_messages = {"required": DAY_NEEDED, "invalid": DAY_NEEDED}

    def to_python(self, value) -> datetime | None:
        text = (value or "").strip()
        if not text:
            return None
        try:
            day = date.fromisoformat(text)
        except ValueError:
            raise forms.ValidationError(self.error_messages["invalid"], code="invalid") from None
        if not moment_supported(day):
            raise forms.ValidationError(OUT_OF_RANGE, code="out_of_range")
        return datetime(day.year, day.month, day.day, tzinfo=UTC)


class SupportedDayField(forms.DateField):
    """A DateField that refuses days outside the supported span
    (core.calendar), as the API's date fields do (core.api_time)."""

    default_error_messages = {"out_of_range": OUT_OF_RANGE}

    def to_python(self, value):
        day = super().to_python(value)
        if day is not None and not moment_supported(day):
            raise forms.ValidationError(self.error_messages["out_of_range"], code="out_of_range")
        return day
