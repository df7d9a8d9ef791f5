from django.urls import path

from audit.api import views

urlpatterns = [
    path("audit/entries", views.AuditEntryListView.as_view(), name="api-audit-entries"),
    path("audit/export", views.AuditExportView.as_view(), name="api-audit-export"),
]
