from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The main job (`up`), the demo seeds and synthetic history."""

    name = "demo"
    default_auto_field = "django.db.models.BigAutoField"
