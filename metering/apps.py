from django.apps import AppConfig


class MeteringConfig(AppConfig):
    """The usage ledger, attribution of device-seconds, rollups and exports."""

    name = "metering"
    default_auto_field = "django.db.models.BigAutoField"
