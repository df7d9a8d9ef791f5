from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """Cross-app platform pages (health, metrics, jobs, errors)."""

    name = "dashboard"
    default_auto_field = "django.db.models.BigAutoField"
