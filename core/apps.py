from django.apps import AppConfig


class CoreConfig(AppConfig):
    """The ground every app may import: job outcomes, recorded from
    Celery's task signals in whatever process runs the task."""

    name = "core"
    label = "core"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core import signals  # noqa: F401  connects the task signal handlers
