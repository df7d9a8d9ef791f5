from django.apps import AppConfig


class BillingConfig(AppConfig):
    """Cost allocation, prices, rating, invoices, Stripe and margin reports."""

    name = "billing"
    default_auto_field = "django.db.models.BigAutoField"
