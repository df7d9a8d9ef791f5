from django.apps import AppConfig


class GatewayConfig(AppConfig):
    """The OpenAI-compatible gateway tenants call (`manage.py gateway`): on
    top of the stack, as it admits, queues, routes and records every request
    and holds it to its tenant's budget and prepaid balance."""

    name = "gateway"

    def ready(self) -> None:
        from gateway import terms_signals

        terms_signals.connect()
