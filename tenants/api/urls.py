from django.urls import path

from tenants.api import views

urlpatterns = [
    path("tenants/me", views.TenantMeView.as_view(), name="tenant-me"),
    path("tenants", views.TenantListView.as_view(), name="tenant-list"),
    path("api-keys", views.ApiKeyListCreateView.as_view(), name="api-key-list"),
    path("api-keys/<int:key_id>/revoke", views.ApiKeyRevokeView.as_view(), name="api-key-revoke"),
]
