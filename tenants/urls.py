from django.contrib.auth import views as auth_views
from django.urls import path

from tenants import views

urlpatterns = [
    path("", views.home, name="home"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("tenant/switch/", views.tenant_switch, name="tenant-switch"),
    path("keys/", views.keys, name="keys"),
    path("keys/<int:key_id>/revoke/", views.key_revoke, name="key-revoke"),
]
