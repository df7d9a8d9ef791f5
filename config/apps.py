from django.apps import AppConfig


class PlatformConfig(AppConfig):
    """Project-wide: the embedded database and its command."""

    name = "config"
    label = "platform"
    default_auto_field = "django.db.models.BigAutoField"
