"""Which tables the audit trail watches, whose tenant each row belongs to,
and which columns it leaves out. A table added here needs a migration that
calls audit.triggers.triggers_install (a test checks every one has its
trigger)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tracked:
    table: str
    # The row's tenant: a column of the row ("tenant_id"; "id" for the
    # tenants table), or "table.column" to look it up through a foreign key
    # ("billing_invoice.invoice_id": the invoice's tenant). Empty: none.
    tenant: str = ""
    # Changed alone, these do not make an entry (use marks, health).
    ignored: tuple[str, ...] = ()
    # Never copied into an entry (a change of one is named in `changed`).
    redacted: tuple[str, ...] = ()


KEY_SECRETS = ("secret_hash",)

TRACKED = (
    # People and their standing: who made whom finance staff (a group),
    # staff or superuser, who set whose password (named as changed, its
    # hash never copied); a sign-in alone (last_login) makes no entry.
    Tracked("auth_user", ignored=("last_login",), redacted=("password",)),
    Tracked("auth_user_groups"),
    # Permissions granted to a person or a group directly (finance_staff in the admin).
    Tracked("auth_user_user_permissions"),
    Tracked("auth_group_permissions"),
    # Tenants, their members, keys and policies (budgets among them).
    Tracked("tenants_tenant", tenant="id"),
    Tracked("tenants_membership", tenant="tenant_id"),
    Tracked("tenants_apikey", tenant="tenant_id", ignored=("last_used_at",), redacted=KEY_SECRETS),
    Tracked("tenants_servicekey", ignored=("last_used_at",), redacted=KEY_SECRETS),
    Tracked("tenants_tenantpolicy", tenant="tenant_id"),
    # Prices, plans, subscriptions and credit.
    Tracked("billing_pricebook"),
    Tracked("billing_modelprice"),
    Tracked("billing_volumetier"),
    Tracked("billing_plan"),
    Tracked("billing_subscription", tenant="tenant_id"),
    Tracked("billing_creditgrant", tenant="tenant_id"),
    # Cost rates, scenarios, reopened periods, exchange rates.
    Tracked("billing_costrate"),
    Tracked("billing_costscenario"),
    Tracked("billing_costperiodreopening"),
    Tracked("billing_fxrate"),
    # Invoices (finalize, void, paid…), credit notes, SLA credits, the issuer.
    Tracked("billing_issuer"),
    Tracked("billing_invoice", tenant="tenant_id"),
    Tracked("billing_creditnote", tenant="billing_invoice.invoice_id"),
    Tracked("billing_slacreditadjustment", tenant="tenant_id"),
    Tracked("billing_slopolicy"),
    Tracked("billing_slacreditrule"),
    Tracked("billing_stripecustomer", tenant="tenant_id"),
    # Tax: the tenants' profiles and the dated rates.
    Tracked("billing_taxprofile", tenant="tenant_id"),
    Tracked("billing_taxdetailsrequest", tenant="tenant_id"),  # a tenant's, to confirm
    Tracked("billing_taxrate", ignored=("stripe_tax_rate_id",)),
    # The fleet's cost facts.
    Tracked("serving_gpusku"),
    Tracked("serving_node"),
    Tracked("serving_gpu"),
    Tracked("serving_pool", tenant="owner_id"),
    # A replica's health and the N the gateway finds for it (adaptive
    # concurrency, every few seconds) are operations, not changes a person
    # made: the fleet page shows them; a person's change of the replica's
    # settings (max_inflight, the concurrency mode) is an entry as ever.
    Tracked(
        "serving_replica",
        ignored=(
            "status",
            "status_since",
            "last_seen_at",
            "last_error",
            "concurrency_limit",
            "concurrency_limit_at",
        ),
    ),
    Tracked("serving_replica_gpus"),
    Tracked("serving_servedmodel"),
    Tracked("serving_loraadapter", tenant="tenant_id"),
    Tracked("serving_reservation", tenant="tenant_id"),
    Tracked("serving_gridintensity"),
    # Where events are sent (the signing secret left out).
    Tracked("webhooks_endpoint", tenant="tenant_id", redacted=("secret",)),
)
