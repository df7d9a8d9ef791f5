from django.apps import AppConfig


class ServingConfig(AppConfig):
    """The fleet: GPUs, nodes, pools, replicas, served models, local vLLM."""

    name = "serving"
    default_auto_field = "django.db.models.BigAutoField"
