"""The audit trail's filters, for the page and the API alike: a bad value
is a 400 naming its field."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

from django import forms
from django.core.exceptions import ValidationError

from audit.choices import Action, Via
from audit.selectors import AuditQuery, subjects
from core.forms import SupportedDayField


def _choices(values) -> list[tuple[str, str]]:
    return [("", "any"), *values]


class AuditFilterForm(forms.Form):
    since = SupportedDayField(required=False, help_text="from this day (UTC), inclusive")
    until = SupportedDayField(required=False, help_text="to this day (UTC), inclusive")
    actor = forms.CharField(required=False, max_length=200)
    table = forms.ChoiceField(required=False)
    action = forms.ChoiceField(required=False, choices=_choices(Action.choices))
    via = forms.ChoiceField(required=False, choices=_choices(Via.choices))
    row_id = forms.CharField(required=False, max_length=64)
    tenant = forms.SlugField(required=False)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["table"].choices = _choices(sorted(subjects().items(), key=lambda i: i[1]))

    def clean(self):
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        if since and until and until < since:
            self.add_error("until", "must not be before since")
        return data

    def query(self) -> AuditQuery:
        data = self.cleaned_data

        def day(value, *, after: bool = False):
            if value is None:
                return None
            start = datetime.combine(value, time(), tzinfo=UTC)
            return start + timedelta(days=1) if after else start

        return AuditQuery(
            since=day(data.get("since")),
            until=day(data.get("until"), after=True),
            actor=data.get("actor", ""),
            table=data.get("table", ""),
            action=data.get("action", ""),
            via=data.get("via", ""),
            row_id=data.get("row_id", ""),
            tenant_slug=data.get("tenant", ""),
        )


def audit_query_parse(params) -> AuditQuery:
    """The query in `params`, or a ValidationError naming each bad field."""
    form = AuditFilterForm(params)
    if not form.is_valid():
        raise ValidationError(form.errors.as_data())
    return form.query()
