from django.urls import path

from billing import invoice_pages, views

urlpatterns = [
    path("costs/", views.costs, name="costs"),
    path("invoices/", invoice_pages.invoices, name="invoices"),
    path("invoices/<int:pk>/", invoice_pages.invoice_document, name="invoice"),
]
