from django.apps import AppConfig


class ServingConfig(AppConfig):
    """The fleet (GPUs, nodes, pools, replicas) and the OpenAI-compatible gateway."""

    name = "serving"
    default_auto_field = "django.db.models.BigAutoField"
