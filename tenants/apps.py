from django.apps import AppConfig


class TenantsConfig(AppConfig):
    """Tenants, their members and roles, API keys and serving policies."""

    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from tenants.api import schema  # noqa: F401  registers the OpenAPI auth scheme
