from django.urls import path, re_path

from billing.api import fx_views, invoice_views, margin_views, views

urlpatterns = [
    path("costs/rates", views.CostRateListView.as_view(), name="cost-rates"),
    path("costs/rates/<int:pk>", views.CostRateDetailView.as_view(), name="cost-rate"),
    path("costs/runs", views.AllocationRunListView.as_view(), name="cost-runs"),
    path("costs/runs/<int:pk>", views.AllocationRunDetailView.as_view(), name="cost-run"),
    path("costs/allocations", views.AllocationSummaryView.as_view(), name="cost-allocations"),
    path("costs/per-million-tokens", views.CostPerTokenView.as_view(), name="cost-per-mtok"),
    path("costs/utilization", views.UtilizationView.as_view(), name="cost-utilization"),
    path("costs/scenarios", views.ScenarioListView.as_view(), name="cost-scenarios"),
    path(
        "costs/scenarios/<int:pk>/compare",
        views.ScenarioCompareView.as_view(),
        name="cost-scenario-compare",
    ),
    path("invoices", invoice_views.InvoiceListView.as_view(), name="api-invoices"),
    path("invoices/<int:pk>", invoice_views.InvoiceDetailView.as_view(), name="api-invoice"),
    path(
        "invoices/<int:pk>/status", invoice_views.InvoiceStatusView.as_view(), name="invoice-status"
    ),
    path(
        "invoices/<int:pk>/credit-notes",
        invoice_views.CreditNoteView.as_view(),
        name="invoice-credit-notes",
    ),
    path("invoice-runs", invoice_views.InvoiceRunListView.as_view(), name="invoice-runs"),
    path("invoice-runs/<int:pk>", invoice_views.InvoiceRunDetailView.as_view(), name="invoice-run"),
    path("credits", invoice_views.CreditBalanceView.as_view(), name="credits"),
    path("fx-rates", fx_views.FxRateListView.as_view(), name="fx-rates"),
    path("fx-rates/bulk", fx_views.FxRateBulkView.as_view(), name="fx-rates-bulk"),
    path("margin-reports", margin_views.MarginReportListView.as_view(), name="margin-reports"),
    path(
        "margin-reports/<int:pk>",
        margin_views.MarginReportDetailView.as_view(),
        name="margin-report",
    ),
    re_path(
        r"^margin-reports/(?P<pk>[0-9]+)/(?P<fmt>csv|html)$",
        margin_views.MarginReportDownloadView.as_view(),
        name="margin-report-download",
    ),
]
