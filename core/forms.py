"""Form fields the dashboard pages of every app share."""

from __future__ import annotations

from datetime import UTC, date, datetime

from django import forms

DAY_NEEDED = "a day as YYYY-MM-DD is needed"


class UtcDayField(forms.Field):
    """A day typed as YYYY-MM-DD, cleaned to that day's 00:00 UTC; empty is
    None when the field is optional. Anything else, or nothing when the
    day is required, is refused with one message."""

    default_error_messages = {"required": DAY_NEEDED, "invalid": DAY_NEEDED}

    def to_python(self, value) -> datetime | None:
        text = (value or "").strip()
        if not text:
            return None
        try:
            day = date.fromisoformat(text)
        except ValueError:
            raise forms.ValidationError(self.error_messages["invalid"], code="invalid") from None
        return datetime(day.year, day.month, day.day, tzinfo=UTC)
