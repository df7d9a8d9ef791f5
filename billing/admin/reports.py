"""Margin reports, read-only."""

from __future__ import annotations

from django.contrib import admin

from billing.admin.common import ReadOnlyAdmin
from billing.models import (
    MarginReport,
)


@admin.register(MarginReport)
class MarginReportAdmin(ReadOnlyAdmin):
    list_display = ["__str__", "period_start", "period_end", "status", "finished_at"]
    exclude = ["csv", "html"]
