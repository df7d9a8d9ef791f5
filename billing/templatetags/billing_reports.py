"""Report figures on pages. `{% period start end %}`: a half-open period
as core.calendar.period_text reads it (times shown when it is not whole
days). `{{ row|margin_pct }}`: a report row's margin %, one decimal; "n/m"
(not meaningful) where the row's revenue is below the floor
billing.reports.margins sets (MARGIN_PCT_FLOOR); a dash where the row has
neither revenue nor cost."""

from django import template

from core.calendar import period_text

register = template.Library()

MISSING = "\u2014"
NOT_MEANINGFUL = "n/m"


@register.simple_tag
def period(start, end) -> str:
    return period_text(start, end)


@register.filter
def margin_pct(row: dict) -> str:
    if row.get("margin_pct_nm"):
        return NOT_MEANINGFUL
    value = row.get("margin_pct")
    if value is None or value == "":
        return MISSING
    return f"{float(value):.1f}"  # ok-float: a percentage shown to one place
