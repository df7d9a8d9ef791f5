from django.urls import path

from billing.payments import webhook

urlpatterns = [
    path("stripe/webhook", webhook.stripe_webhook, name="stripe-webhook"),
]
