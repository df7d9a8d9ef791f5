from django.apps import AppConfig


class AuditConfig(AppConfig):
    """Connects the actor context to Celery's task signals and to every new
    database connection (audit.context)."""

    name = "audit"
    label = "audit"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from audit import context  # noqa: F401  connects its signal handlers
