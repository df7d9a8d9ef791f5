from django.urls import path

from billing.payments import webhook
from billing.web import (
    costs,
    finance,
    fleet,
    invoices,
    portal,
    receivables,
    request_trace,
    runs,
    slo,
)

urlpatterns = [
    path("costs/", costs.costs, name="costs"),
    path("costs/runs", runs.allocation_run_start, name="allocation-run-start"),
    path("finance/", finance.finance_overview, name="finance"),
    path("finance/tenants/<slug:slug>/", finance.finance_tenant, name="finance-tenant"),
    path("finance/models/<str:name>/", finance.finance_model, name="finance-model"),
    path("finance/receivables/", receivables.receivables, name="receivables"),
    path("finance/slo/", slo.finance_slo, name="finance-slo"),
    path("reconciliation/", finance.reconciliation, name="reconciliation"),
    path("fleet/", fleet.fleet, name="fleet"),
    path("requests/<str:request_id>/", request_trace.request_trace, name="request-trace"),
    path("usage/", portal.usage, name="usage-page"),
    path("invoices/", invoices.invoices, name="invoices"),
    path("invoices/runs", runs.invoice_run_start, name="invoice-run-start"),
    path("invoices/<int:pk>/", invoices.invoice_document, name="invoice"),
    path("invoices/<int:pk>/action", invoices.invoice_action, name="invoice-action"),
    path("invoices/<int:pk>/sla-credit", invoices.invoice_sla_credit, name="invoice-sla-credit"),
    path("stripe/webhook", webhook.stripe_webhook, name="stripe-webhook"),
]
