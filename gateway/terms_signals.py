"""Every save or delete of a row that changes what the gateway holds a
request to, or where it routes one (the fleet), tells the gateways at
once (core.changes), whichever process made it: the admin, the API, a
Celery task, a shell. Bulk updates send no signal; the services that make
them call core.changes themselves."""

from __future__ import annotations

from django.db.models.signals import post_delete, post_save

from core.changes import fleet_changed, terms_changed

# Model label -> how to find the tenant of a row (None: every tenant).
_TENANT_OF = {
    "tenants.Tenant": lambda row: row.pk,
    "tenants.TenantPolicy": lambda row: row.tenant_id,
    "tenants.ApiKey": lambda row: row.tenant_id,
    "billing.Subscription": lambda row: row.tenant_id,
    "billing.CreditGrant": lambda row: row.tenant_id,
    "billing.CreditApplication": lambda row: row.grant.tenant_id,
    "billing.Invoice": lambda row: row.tenant_id,
    "billing.Plan": lambda row: None,
    "billing.PriceBook": lambda row: None,
    "billing.ModelPrice": lambda row: None,
    "billing.VolumeTier": lambda row: None,
}


# What the gateway's fleet snapshot is read from (gateway.fleet).
FLEET_MODELS = (
    "serving.ServedModel",
    "serving.LoraAdapter",
    "serving.Pool",
    "serving.Replica",
    "serving.ReplicaGpu",
    "serving.Reservation",
    "billing.SloPolicy",  # the inter-token promise an adaptive N keeps
)


def _fleet_changed(sender, instance, **kwargs) -> None:
    if not kwargs.get("raw"):
        fleet_changed()


def _changed(sender, instance, **kwargs) -> None:
    if kwargs.get("raw"):
        return  # loading fixtures
    terms_changed(_TENANT_OF[sender._meta.label](instance))


def connect() -> None:
    from django.apps import apps

    for label in _TENANT_OF:
        model = apps.get_model(label)
        post_save.connect(_changed, sender=model, dispatch_uid=f"terms-{label}")
        post_delete.connect(_changed, sender=model, dispatch_uid=f"terms-{label}-delete")
    for label in FLEET_MODELS:
        model = apps.get_model(label)
        post_save.connect(_fleet_changed, sender=model, dispatch_uid=f"fleet-{label}")
        post_delete.connect(_fleet_changed, sender=model, dispatch_uid=f"fleet-{label}-delete")
