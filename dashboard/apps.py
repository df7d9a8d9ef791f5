from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """The web app: every page, health, metrics and the error pages."""

    name = "dashboard"
    default_auto_field = "django.db.models.BigAutoField"
