from django.apps import AppConfig


class CoreConfig(AppConfig):
    """The ground every app may import: job outcomes, recorded from
    Celery's task signals in whatever process runs the task."""

    name = "core"
    label = "core"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from core import signals  # noqa: F401  connects the task signal handlers
        from core.outages import database_connected

        # A connection made ends a database outage's episode (one line said so).
        connection_created.connect(database_connected, dispatch_uid="core.outages")
