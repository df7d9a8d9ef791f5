"""Finance's page of the raw ledger's archives (/finance/archives/): the
retention horizon, the months due, and every month archived: its file,
rows, token sums, size and SHA-256 as recorded when the file was read
back, and when its partition was dropped."""

from __future__ import annotations

from django.shortcuts import render
from django.utils import timezone

from metering.selectors.archive import ledger_archives, ledger_retention
from tenants.access import finance_staff_required


@finance_staff_required
def ledger_archives_page(request):
    context = {
        "archives": ledger_archives(),
        "retention": ledger_retention(now=timezone.now()),
    }
    return render(request, "dashboard/archives.html", context)
