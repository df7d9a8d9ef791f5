from django.urls import path

from billing import (
    finance_pages,
    fleet_page,
    invoice_pages,
    portal,
    receivables_page,
    request_trace,
    run_pages,
    views,
    webhooks,
)

urlpatterns = [
    path("costs/", views.costs, name="costs"),
    path("costs/runs", run_pages.allocation_run_start, name="allocation-run-start"),
    path("finance/", finance_pages.finance_overview, name="finance"),
    path("finance/tenants/<slug:slug>/", finance_pages.finance_tenant, name="finance-tenant"),
    path("finance/models/<str:name>/", finance_pages.finance_model, name="finance-model"),
    path("finance/receivables/", receivables_page.receivables, name="receivables"),
    path("reconciliation/", finance_pages.reconciliation, name="reconciliation"),
    path("fleet/", fleet_page.fleet, name="fleet"),
    path("requests/<str:request_id>/", request_trace.request_trace, name="request-trace"),
    path("usage/", portal.usage, name="usage-page"),
    path("invoices/", invoice_pages.invoices, name="invoices"),
    path("invoices/runs", run_pages.invoice_run_start, name="invoice-run-start"),
    path("invoices/<int:pk>/", invoice_pages.invoice_document, name="invoice"),
    path("invoices/<int:pk>/action", invoice_pages.invoice_action, name="invoice-action"),
    path("stripe/webhook", webhooks.stripe_webhook, name="stripe-webhook"),
]
