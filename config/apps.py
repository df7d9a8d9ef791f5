from django.apps import AppConfig


class PlatformConfig(AppConfig):
    """Project-wide commands: the main job (`up`) and the embedded database."""

    name = "config"
    label = "platform"
    default_auto_field = "django.db.models.BigAutoField"
