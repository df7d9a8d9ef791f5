"""A tenant's policy as finance edits it (page, API): its gateway limits,
scheduling class, fair share and monthly budget, checked as the admin's
form checks them (the model's validators and constraints, and the budget
read by the one parser in the tenant's billing currency,
tenants.services.budget_parse: 1.5 JPY is refused). An error names the
field; nothing is written unless every field passes. The gateway holds
the new terms from its next request (gateway.terms_signals)."""

from __future__ import annotations

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import transaction

from core.errors import InputError
from tenants.models import Tenant, TenantPolicy
from tenants.services import budget_parse

POLICY_FIELDS = (
    "priority_class",
    "max_concurrent_requests",
    "requests_per_minute",
    "tokens_per_minute",
    "max_inflight_tokens",
    "monthly_budget",
    "budget_soft_percent",
    "budget_hard_percent",
    "fair_share_weight",
    "queue_timeout_ms",
    "max_queued_requests",
)
# Which field a constraint's refusal is about (the admin shows it above the form).
_CONSTRAINT_FIELD = {"policy_soft_le_hard": "budget_soft_percent"}


@transaction.atomic
def tenant_policy_update(*, tenant: Tenant, **changes) -> TenantPolicy:
    """Set the named fields of `tenant`'s policy (None clears a limit or
    the budget); the others stay as they are."""
    unknown = set(changes) - set(POLICY_FIELDS)
    if unknown:
        raise InputError(sorted(unknown)[0], "not a field of a tenant's policy")
    policy = TenantPolicy.objects.select_for_update().get(tenant=tenant)
    for field, value in changes.items():
        setattr(policy, field, value)
    if policy.monthly_budget is not None:
        policy.monthly_budget = budget_parse(
            policy.monthly_budget, currency=tenant.billing_currency
        )
    try:
        policy.full_clean(exclude=[f for f in _all_fields() if f not in POLICY_FIELDS])
    except ValidationError as error:
        field, messages = next(iter(error.message_dict.items()))
        if field == NON_FIELD_ERRORS:
            field = _constraint_field(error)
        raise InputError(field, messages[0]) from None
    policy.save()
    return policy


def _all_fields() -> list[str]:
    return [f.name for f in TenantPolicy._meta.concrete_fields]


def _constraint_field(error: ValidationError) -> str:
    text = " ".join(error.messages)
    for constraint, field in _CONSTRAINT_FIELD.items():
        if constraint in text:
            return field
    return "budget_soft_percent" if "soft" in text else "priority_class"
