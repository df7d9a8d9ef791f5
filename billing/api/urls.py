from django.urls import path, re_path

from billing.api import costs, focus, fx, invoices, margins, prices, slo, tax
from billing.spend import api as spend

urlpatterns = [
    path("costs/rates", costs.CostRateListView.as_view(), name="cost-rates"),
    path("costs/rates/<int:pk>", costs.CostRateDetailView.as_view(), name="cost-rate"),
    path("costs/reopenings", costs.CostReopeningListView.as_view(), name="cost-reopenings"),
    path("price-books", prices.PriceBookListView.as_view(), name="api-price-books"),
    path("price-books/<int:pk>", prices.PriceBookDetailView.as_view(), name="api-price-book"),
    path("plans", prices.PlanListView.as_view(), name="api-plans"),
    path("plans/<int:pk>", prices.PlanDetailView.as_view(), name="api-plan"),
    path(
        "tenants/<slug:slug>/subscriptions",
        prices.SubscriptionListView.as_view(),
        name="api-tenant-subscriptions",
    ),
    path(
        "tenants/<slug:slug>/subscriptions/<int:pk>",
        prices.SubscriptionDetailView.as_view(),
        name="api-tenant-subscription",
    ),
    path("tenants/<slug:slug>/policy", prices.PolicyView.as_view(), name="api-tenant-policy"),
    path("costs/runs", costs.AllocationRunListView.as_view(), name="cost-runs"),
    path("costs/runs/<int:pk>", costs.AllocationRunDetailView.as_view(), name="cost-run"),
    path("costs/allocations", costs.AllocationSummaryView.as_view(), name="cost-allocations"),
    path("costs/per-million-tokens", costs.CostPerTokenView.as_view(), name="cost-per-mtok"),
    path("costs/utilization", costs.UtilizationView.as_view(), name="cost-utilization"),
    path("costs/scenarios", costs.ScenarioListView.as_view(), name="cost-scenarios"),
    path(
        "costs/scenarios/<int:pk>/compare",
        costs.ScenarioCompareView.as_view(),
        name="cost-scenario-compare",
    ),
    path("invoices", invoices.InvoiceListView.as_view(), name="api-invoices"),
    path("invoices/<int:pk>", invoices.InvoiceDetailView.as_view(), name="api-invoice"),
    path("invoices/<int:pk>/status", invoices.InvoiceStatusView.as_view(), name="invoice-status"),
    path(
        "invoices/<int:pk>/credit-notes",
        invoices.CreditNoteView.as_view(),
        name="invoice-credit-notes",
    ),
    path(
        "invoices/<int:pk>/sla-credits",
        slo.InvoiceSlaCreditView.as_view(),
        name="invoice-sla-credits",
    ),
    path("slo", slo.SloView.as_view(), name="slo"),
    path("invoice-runs", invoices.InvoiceRunListView.as_view(), name="invoice-runs"),
    path("invoice-runs/<int:pk>", invoices.InvoiceRunDetailView.as_view(), name="invoice-run"),
    path("credits", invoices.CreditBalanceView.as_view(), name="credits"),
    path("credit-grants", spend.CreditGrantCreateView.as_view(), name="credit-grants"),
    path("tenants/<slug:slug>/budget", spend.BudgetView.as_view(), name="tenant-budget"),
    path("spend", spend.StandingView.as_view(), name="spend"),
    path("usage/focus", focus.FocusExportView.as_view(), name="usage-focus"),
    path("tax/rates", tax.TaxRateListView.as_view(), name="tax-rates"),
    path("tenants/<slug:slug>/tax-profile", tax.TaxProfileView.as_view(), name="tax-profile"),
    path(
        "tenants/<slug:slug>/tax-profile/confirm",
        tax.TaxDetailsConfirmView.as_view(),
        name="tax-profile-confirm",
    ),
    path("fx-rates", fx.FxRateListView.as_view(), name="fx-rates"),
    path("fx-rates/bulk", fx.FxRateBulkView.as_view(), name="fx-rates-bulk"),
    path("margin-reports", margins.MarginReportListView.as_view(), name="margin-reports"),
    path(
        "margin-reports/<int:pk>",
        margins.MarginReportDetailView.as_view(),
        name="margin-report",
    ),
    re_path(
        r"^margin-reports/(?P<pk>[0-9]+)/(?P<fmt>csv|html)$",
        margins.MarginReportDownloadView.as_view(),
        name="margin-report-download",
    ),
]
