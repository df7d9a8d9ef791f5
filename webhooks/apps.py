from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    """Hears core's job failures (core.signals.job_failed) as `job.failed`."""

    name = "webhooks"
    label = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from webhooks import receivers  # noqa: F401  connects the signal receivers
