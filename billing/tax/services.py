"""Tax profiles and rates: finance's changes, checked (a bad country or
tax id is a BillingInputError naming the field, before anything is
written), and what invoicing reads of them, once for many tenants."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime

from django.db import IntegrityError, transaction

from billing.errors import BillingInputError
from billing.models import Issuer, TaxDetailsRequest, TaxProfile, TaxRate
from billing.tax.rules import (
    Buyer,
    Rate,
    TaxDecision,
    TaxInputError,
    country_clean,
    tax_date,
    tax_decide,
    tax_id_clean,
)
from core.calendar import OUT_OF_RANGE, moment_supported
from core.errors import InputError
from core.plain_decimal import plain_decimal
from tenants.models import Tenant

NAME_MAX = TaxRate._meta.get_field("name").max_length
REASON_MAX = TaxProfile._meta.get_field("exempt_reason").max_length


def _checked(call, *args, **kwargs):
    try:
        return call(*args, **kwargs)
    except TaxInputError as exc:
        raise BillingInputError(exc.field, exc.message) from None


def tax_profile_checked(
    *, country: str | None, tax_id: str | None = "", exempt: bool = False, exempt_reason=""
) -> dict:
    """A tax profile's fields as stored, or a BillingInputError naming the
    first bad one (the API, the page and the admin all check here)."""
    country = _checked(country_clean, country)
    tax_id = _checked(tax_id_clean, tax_id, country=country)
    exempt_reason = (exempt_reason or "").strip()
    if exempt and not exempt_reason:
        raise BillingInputError("exempt_reason", "an exemption needs its reason (it is printed)")
    if len(exempt_reason) > REASON_MAX:
        raise BillingInputError("exempt_reason", f"at most {REASON_MAX} characters")
    return {
        "country": country,
        "tax_id": tax_id,
        "exempt": bool(exempt),
        "exempt_reason": exempt_reason if exempt else "",
    }


def tax_profile_set(*, tenant: Tenant, **fields) -> TaxProfile:
    """The tenant's tax profile, created or replaced (tax_profile_checked's
    fields)."""
    profile, _ = TaxProfile.objects.update_or_create(
        tenant=tenant, defaults=tax_profile_checked(**fields)
    )
    return profile


def tax_details_set(
    *, tenant: Tenant, country: str | None, tax_id: str | None, by=None
) -> TaxDetailsRequest | None:
    """A tenant's own tax details, sent by its owners and admins (the
    invoices page, the API): the country and VAT/GST id, checked as
    finance's are, wait for finance to confirm them (tax_details_confirm);
    until then the confirmed profile (or none) applies, so a tenant cannot
    reverse-charge itself by typing another country's VAT id. The same
    details as confirmed withdraw a request. Returns the request (None:
    nothing waits)."""
    fields = tax_profile_checked(country=country, tax_id=tax_id or "")
    with transaction.atomic():
        current = TaxProfile.objects.filter(tenant=tenant).first()
        if current is not None and (current.country, current.tax_id) == (
            fields["country"],
            fields["tax_id"],
        ):
            TaxDetailsRequest.objects.filter(tenant=tenant).delete()
            return None
        request, _ = TaxDetailsRequest.objects.update_or_create(
            tenant=tenant,
            defaults={"country": fields["country"], "tax_id": fields["tax_id"], "requested_by": by},
        )
        return request


def tax_details_confirm(*, tenant: Tenant) -> TaxProfile:
    """Finance confirms a tenant's requested details: its profile becomes
    them, for invoices rated from now on. An exemption stays while the
    country stays (it rests on that country's law)."""
    with transaction.atomic():
        request = TaxDetailsRequest.objects.select_for_update().filter(tenant=tenant).first()
        if request is None:
            raise BillingInputError("tenant", f"{tenant.slug} has no tax details waiting")
        current = TaxProfile.objects.select_for_update().filter(tenant=tenant).first()
        fields = tax_profile_checked(country=request.country, tax_id=request.tax_id)
        if current is not None and current.exempt and current.country == fields["country"]:
            fields.update(exempt=True, exempt_reason=current.exempt_reason)
        profile, _ = TaxProfile.objects.update_or_create(tenant=tenant, defaults=fields)
        request.delete()
        return profile


def tax_profile_clear(*, tenant: Tenant) -> None:
    TaxProfile.objects.filter(tenant=tenant).delete()


def tax_rate_checked(*, country: str | None, name: str | None, percent, valid_from) -> dict:
    """A rate's fields as stored, or a BillingInputError naming the first
    bad one; a country's rate from a day already set is refused too."""
    country = _checked(country_clean, country)
    name = (name or "").strip()
    if not name or len(name) > NAME_MAX:
        raise BillingInputError(
            "name", f'what invoices call the tax ("VAT"), 1 to {NAME_MAX} characters'
        )
    try:
        percent = plain_decimal(
            "" if percent is None else percent, field="percent", places=4, max_digits=7
        )
    except InputError as error:
        raise BillingInputError(error.field, error.message) from None
    if not 0 <= percent <= 100:
        raise BillingInputError("percent", "a percent from 0 to 100")
    if isinstance(valid_from, datetime):
        valid_from = valid_from.date()
    if not isinstance(valid_from, date):
        try:
            valid_from = date.fromisoformat(str(valid_from).strip())
        except ValueError:
            raise BillingInputError(
                "valid_from", f"{valid_from!r} is not a day (YYYY-MM-DD)"
            ) from None
    if not moment_supported(valid_from):
        raise BillingInputError("valid_from", OUT_OF_RANGE)
    if TaxRate.objects.filter(country=country, valid_from=valid_from).exists():
        raise BillingInputError("valid_from", _TAKEN.format(country=country, day=valid_from))
    return {"country": country, "name": name, "percent": percent, "valid_from": valid_from}


_TAKEN = "{country} already has a rate from {day:%Y-%m-%d}"


def tax_rate_create(**fields) -> TaxRate:
    """A jurisdiction's rate from its day on (tax_rate_checked's fields)."""
    checked = tax_rate_checked(**fields)
    try:
        with transaction.atomic():
            return TaxRate.objects.create(**checked)
    except IntegrityError:  # the same rate entered twice at once
        day = checked["valid_from"]
        raise BillingInputError(
            "valid_from", _TAKEN.format(country=checked["country"], day=day)
        ) from None


@dataclass(frozen=True)
class TaxReads:
    """What deciding tax for many tenants reads, once: their profiles, every
    rate (a short table), every issuer (a few rows)."""

    buyers: dict[int, Buyer]
    rates: list[Rate]
    issuers: dict[int, tuple[str, str]]  # id -> (country, tax id)


def tax_reads(*, tenant_ids) -> TaxReads:
    profiles = TaxProfile.objects.filter(tenant_id__in=list(tenant_ids))
    return TaxReads(
        buyers={
            p.tenant_id: Buyer(
                country=p.country,
                tax_id=p.tax_id,
                exempt=p.exempt,
                exempt_reason=p.exempt_reason,
            )
            for p in profiles
        },
        rates=[
            Rate(
                id=r.pk, country=r.country, name=r.name, percent=r.percent, valid_from=r.valid_from
            )
            for r in TaxRate.objects.all()
        ],
        issuers={i.pk: (i.country, i.tax_id) for i in Issuer.objects.all()},
    )


def tax_decision(
    *, tenant_id: int, issuer_id: int, period_end: datetime, reads: TaxReads
) -> TaxDecision:
    """The tax treatment of the tenant's invoice for a period ending then."""
    issuer_country, issuer_tax_id = reads.issuers.get(issuer_id, ("", ""))
    return tax_decide(
        issuer_country=issuer_country,
        issuer_tax_id=issuer_tax_id,
        buyer=reads.buyers.get(tenant_id),
        rates=reads.rates,
        on=tax_date(period_end),
    )


@dataclass(frozen=True)
class TaxByRate:
    """An invoice's tax at one rate: what it was charged on, and how much."""

    rate: TaxRate
    base_minor: int
    tax_minor: int


def tax_by_rate(lines) -> list[TaxByRate]:
    """Invoice lines (stored, or drafts) summed per tax rate, by rate id."""
    base: dict[int, int] = {}
    tax: dict[int, int] = {}
    for line in lines:
        if line.tax_rate_id is not None:
            base[line.tax_rate_id] = base.get(line.tax_rate_id, 0) + line.amount_minor
            tax[line.tax_rate_id] = tax.get(line.tax_rate_id, 0) + line.tax_minor
    rates = TaxRate.objects.in_bulk(list(base)) if base else {}
    return [TaxByRate(rates[pk], base[pk], tax[pk]) for pk in sorted(base)]
