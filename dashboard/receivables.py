"""Finance staff's receivables page: open invoices (finalized, not paid,
void or uncollectible; credit notes deducted) by how long past due, with
totals per currency (never added across currencies), the oldest listed;
and every budgeted tenant's standing against its monthly budget."""

from __future__ import annotations

from django.shortcuts import render
from django.utils import timezone

from billing.invoicing.selectors import receivables_aging
from billing.spend.budgets import budget_status_list
from tenants.access import finance_staff_required
from tenants.selectors import tenant_policy_count


@finance_staff_required
def receivables(request):
    now = timezone.now()
    budgets = budget_status_list(now=now)
    context = {
        "aging": receivables_aging(as_of=now),
        "budgets": budgets,
        "unbudgeted": tenant_policy_count() - len(budgets),
    }
    return render(request, "dashboard/receivables.html", context)
