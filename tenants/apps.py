from django.apps import AppConfig


class TenantsConfig(AppConfig):
    """Tenants, their members and roles, API keys and serving policies."""

    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib import admin

        from tenants.api import schema  # noqa: F401  registers the OpenAPI auth scheme
        from tenants.sign_in_limits import LockingAdminAuthenticationForm

        # The admin's sign-in is locked out with backoff like the site's.
        admin.site.login_form = LockingAdminAuthenticationForm
