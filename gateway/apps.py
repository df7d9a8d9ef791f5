from django.apps import AppConfig


class GatewayConfig(AppConfig):
    """The OpenAI-compatible gateway tenants call (`manage.py gateway`): on
    top of the stack, as it admits, queues, routes and records every request
    and will price it against budgets and prepaid balances (issue 18)."""

    name = "gateway"
