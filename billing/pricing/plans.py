"""Plans and subscriptions as finance writes them (pages, API, admin).

A plan's terms (commitment, discount, prepaid) priced every month a
subscription to it ran, so a plan any started subscription uses is never
edited (PlanInUseError, 409): new terms are a new plan, and tenants move to
it from a date. A move ends the tenant's subscription in force at that
moment and starts one on the new plan, keeping its billing anchor day and
issuer; it may not take effect before the current hour nor inside a
closed period (TermsDatedError, 409, as price versions,
billing.pricing.catalog). A move not yet started may be withdrawn.

A plan's minimum commitment is an amount as it stands on an invoice: no
more places than its currency's minor units (500.5 JPY is refused)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db.models import Q
from django.utils import timezone

from billing.errors import BillingInputError, PlanInUseError, SubscriptionStartedError
from billing.models import Issuer, Plan, Subscription
from billing.pricing.catalog import moment_checked, terms_change_check
from core.currencies import currency_is_iso
from core.locks import advisory_xact_lock
from core.plain_decimal import plain_decimal
from tenants.models import Tenant

PLAN_FIELDS = ("name", "currency", "minimum_commit", "discount_percent", "prepaid")
NAME_MAX = Plan._meta.get_field("name").max_length
_COMMIT = Plan._meta.get_field("minimum_commit")
_DISCOUNT = Plan._meta.get_field("discount_percent")
SUBSCRIPTIONS_LOCK = "billing_subscriptions"


def plan_create(
    *,
    name: str,
    currency: str = "USD",
    minimum_commit: Decimal | str | int = 0,
    discount_percent: Decimal | str | int = 0,
    prepaid: bool = False,
) -> Plan:
    """A new plan, its terms checked (errors name the field)."""
    terms = _terms_checked(
        name=name,
        currency=currency,
        minimum_commit=minimum_commit,
        discount_percent=discount_percent,
        prepaid=prepaid,
    )
    return Plan.objects.create(**terms)


def plan_update(*, plan: Plan, now: datetime | None = None, **changes) -> Plan:
    """Edit a plan no started subscription uses (one scheduled, or none)."""
    unknown = set(changes) - set(PLAN_FIELDS)
    if unknown:
        raise BillingInputError(sorted(unknown)[0], "not a plan's term")
    with advisory_xact_lock(SUBSCRIPTIONS_LOCK):
        plan = Plan.objects.select_for_update().get(pk=plan.pk)
        if plan.subscriptions.filter(start__lte=now or timezone.now()).exists():
            raise PlanInUseError(plan)
        current = {f: getattr(plan, f) for f in PLAN_FIELDS}
        terms = _terms_checked(**(current | changes), plan=plan)
        for field, value in terms.items():
            setattr(plan, field, value)
        plan.save()
    return plan


def _terms_checked(
    *, name, currency, minimum_commit, discount_percent, prepaid, plan: Plan | None = None
) -> dict:
    if not isinstance(name, str) or not name.strip():
        raise BillingInputError("name", "a plan needs a name")
    name = name.strip()
    if len(name) > NAME_MAX:
        raise BillingInputError("name", f"at most {NAME_MAX} characters")
    taken = Plan.objects.filter(name=name).exclude(pk=plan.pk if plan else None)
    if taken.exists():
        raise BillingInputError("name", f"a plan named {name!r} exists")
    if not currency_is_iso(currency):
        raise BillingInputError(
            "currency", f"{currency!r} is not an ISO 4217 currency code (e.g. USD, EUR, JPY)"
        )
    commit = plain_decimal(
        _typed(minimum_commit),
        field="minimum_commit",
        places=_COMMIT.decimal_places,
        max_digits=_COMMIT.max_digits,
        currency=currency,
    )
    discount = plain_decimal(
        _typed(discount_percent),
        field="discount_percent",
        places=_DISCOUNT.decimal_places,
        max_digits=_DISCOUNT.max_digits,
    )
    if discount > 100:
        raise BillingInputError("discount_percent", "a percent from 0 to 100")
    return {
        "name": name,
        "currency": currency,
        "minimum_commit": commit,
        "discount_percent": discount,
        "prepaid": bool(prepaid),
    }


def _typed(value):
    return value if isinstance(value, (int, Decimal)) else str("" if value is None else value)


def subscription_move(
    *,
    tenant: Tenant,
    plan: Plan,
    effective_from: datetime,
    anchor_day: int | None = None,
    issuer: Issuer | None = None,
    now: datetime | None = None,
) -> Subscription:
    """Move `tenant` to `plan` from `effective_from`: its subscription in
    force then ends there and a new one starts, keeping its anchor day and
    issuer (a tenant's first subscription takes `anchor_day`, default 1,
    and `issuer`)."""
    effective_from = moment_checked(effective_from)
    with advisory_xact_lock(SUBSCRIPTIONS_LOCK):
        terms_change_check(moment=effective_from, now=now)
        subscriptions = Subscription.objects.select_for_update().filter(tenant=tenant)
        later = subscriptions.filter(start__gte=effective_from).order_by("start").first()
        if later is not None:
            raise BillingInputError(
                "effective_from",
                f"{tenant.slug} moves to {later.plan.name} from "
                f"{later.start:%Y-%m-%d %H:%M} UTC: a move starts after the latest "
                f"(or withdraw that one first)",
            )
        current = (
            subscriptions.filter(start__lt=effective_from)
            .filter(Q(end__isnull=True) | Q(end__gt=effective_from))
            .order_by("start")
            .last()
        )
        if current is not None:
            if current.plan_id == plan.pk:
                raise BillingInputError("plan", f"{tenant.slug} is on {plan.name} then already")
            if anchor_day is not None and anchor_day != current.anchor_day:
                raise BillingInputError(
                    "anchor_day",
                    f"{tenant.slug} is billed from day {current.anchor_day}: a move keeps it",
                )
            anchor_day, issuer, end = current.anchor_day, current.issuer, current.end
            current.end = effective_from
            current.save(update_fields=["end"])
        else:
            end = None
        anchor_day = 1 if anchor_day is None else anchor_day
        if not 1 <= anchor_day <= 28:
            raise BillingInputError("anchor_day", "a day of the month from 1 to 28")
        return Subscription.objects.create(
            tenant=tenant,
            plan=plan,
            issuer=issuer,
            anchor_day=anchor_day,
            start=effective_from,
            end=end,
        )


def subscription_withdraw(*, subscription: Subscription, now: datetime | None = None) -> None:
    """Withdraw a move not yet started: the subscription it ended runs on."""
    with advisory_xact_lock(SUBSCRIPTIONS_LOCK):
        subscription = Subscription.objects.select_for_update().get(pk=subscription.pk)
        if subscription.start <= (now or timezone.now()):
            raise SubscriptionStartedError(subscription)
        for before in Subscription.objects.select_for_update().filter(
            tenant_id=subscription.tenant_id, end=subscription.start
        ):
            before.end = subscription.end
            before.save(update_fields=["end"])
        subscription.delete()
