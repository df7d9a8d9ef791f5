"""Price books as finance writes them (pages, API, admin): versions of a
named list, each in force from its `effective_from` until the next
version of the name takes over.

History reproduces (invariant 9): a version in force (or past) is never
edited, nor are its prices; a change is a new version from a date, which
closes the version it supersedes there. A scheduled version (not yet in
force) may be edited or withdrawn. A new or moved version may not take
effect before the current hour (usage until now was rated under the
version in force) nor inside a closed period, invoiced up to the end of
the latest finalized invoice's period (both TermsDatedError, a 409 naming
`effective_from`). The models refuse an edit of a version in force
whatever path it comes by (billing.models.prices).

Every amount is read by the one parser (core.plain_decimal): unit prices
keep 9 decimal places in any currency (a yen price per GPU-second is a
fraction of a yen), so a currency's minor units bound amounts invoiced as
they stand (a plan's commitment, billing.pricing.plans), not unit prices."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal

from django.utils import timezone

from billing.choices import TokenKind
from billing.costs.closing import cost_closed_until
from billing.errors import BillingInputError, PriceVersionInForceError, TermsDatedError
from billing.models import CostPeriodReopening, ModelPrice, PriceBook, VolumeTier
from core.calendar import OUT_OF_RANGE, moment_supported
from core.currencies import currency_is_iso
from core.errors import InputError
from core.locks import advisory_xact_lock
from core.plain_decimal import plain_decimal
from serving.models import ServedModel
from tenants.choices import Tier

# One writer of price books at a time, so two versions of a name cannot
# both pass the "latest version" check.
PRICES_LOCK = "billing_price_books"
FEES = ("reservation_per_gpu_hour", "dedicated_per_gpu_month")
TOKEN_PRICES = ("input_per_mtok", "cached_input_per_mtok", "output_per_mtok")
EDITABLE = ("effective_from", *FEES, "prices")
NAME_MAX = PriceBook._meta.get_field("name").max_length
_PRICE_FIELD = ModelPrice._meta.get_field("input_per_mtok")


def hour_start(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def terms_change_check(
    *, moment: datetime, field: str = "effective_from", now: datetime | None = None
) -> None:
    """Raise TermsDatedError when a change of prices, plans or subscriptions
    taking effect at `moment` would reprice what already happened: inside
    a closed period that finance has not reopened (CostPeriodReopening,
    billing.costs.closing), or before the current hour."""
    closed_until = cost_closed_until()
    if closed_until is not None and moment < closed_until:
        reopened = CostPeriodReopening.objects.filter(start__lte=moment, end__gt=moment).exists()
        if not reopened:
            raise TermsDatedError(field=field, moment=moment, closed_until=closed_until)
    hour = hour_start(now or timezone.now())
    if moment < hour:
        raise TermsDatedError(field=field, moment=moment, hour=hour)


def moment_checked(moment: object, *, field: str = "effective_from") -> datetime:
    """A dated change's moment: timezone-aware, within the supported span,
    on a whole hour (usage is rated by the hour), or an InputError naming
    `field`."""
    if not isinstance(moment, datetime):
        raise BillingInputError(field, "a date and time is needed")
    if moment.tzinfo is None:
        raise BillingInputError(field, "must carry a timezone")
    if not moment_supported(moment):
        raise BillingInputError(field, OUT_OF_RANGE)
    if moment != hour_start(moment):
        raise BillingInputError(field, "must be on a whole hour (usage is rated by the hour)")
    return moment


def unit_price(value, *, field: str, optional: bool = False) -> Decimal | None:
    """A unit price (per million tokens, per GPU-second, a fee per GPU-hour
    or GPU-month) through the one parser: 0 or more, at most 9 places."""
    if value is None or value == "":
        if optional:
            return None
        raise BillingInputError(field, "a price is needed")
    return plain_decimal(
        value if isinstance(value, (int, Decimal)) else str(value),
        field=field,
        places=_PRICE_FIELD.decimal_places,
        max_digits=_PRICE_FIELD.max_digits,
    )


def price_book_version_create(
    *,
    name: str,
    effective_from: datetime,
    tier: str = "",
    currency: str = "USD",
    reservation_per_gpu_hour: Decimal | str | int = 0,
    dedicated_per_gpu_month: Decimal | str | int = 0,
    prices: Iterable[Mapping] = (),
    version: int | None = None,
    now: datetime | None = None,
) -> PriceBook:
    """A new version of the price book `name` (its first: version 1) from
    `effective_from`, with its model prices and graduated volume tiers
    (`prices`: one mapping per model, as `prices_checked` reads them). The
    version in force then (or open) closes there. Versions of a name keep
    its tier and currency: a list for another is another name."""
    name = _name_checked(name)
    if tier not in Tier.values and tier != "":
        raise BillingInputError("tier", f"one of {', '.join(Tier.values)}, or empty for every tier")
    if not currency_is_iso(currency):
        raise BillingInputError(
            "currency", f"{currency!r} is not an ISO 4217 currency code (e.g. USD, EUR, JPY)"
        )
    fees = {
        "reservation_per_gpu_hour": unit_price(
            reservation_per_gpu_hour, field="reservation_per_gpu_hour"
        ),
        "dedicated_per_gpu_month": unit_price(
            dedicated_per_gpu_month, field="dedicated_per_gpu_month"
        ),
    }
    rows = prices_checked(prices)
    effective_from = moment_checked(effective_from)
    with advisory_xact_lock(PRICES_LOCK):
        versions = list(PriceBook.objects.select_for_update().filter(name=name).order_by("version"))
        if versions:
            latest = versions[-1]
            if (latest.tier, latest.currency) != (tier, currency):
                field = "tier" if latest.tier != tier else "currency"
                raise BillingInputError(
                    field,
                    f"{name} prices {latest.tier or 'every tier'} in {latest.currency}: a list "
                    f"for another tier or currency is a book of another name",
                )
        terms_change_check(moment=effective_from, now=now)
        later = [v for v in versions if v.effective_from >= effective_from]
        if later:
            last = later[-1]
            raise BillingInputError(
                "effective_from",
                f"{name} v{last.version} takes effect {last.effective_from:%Y-%m-%d %H:%M} UTC: "
                f"a new version starts after the latest (or withdraw that one first)",
            )
        newest = max((v.version for v in versions), default=0)
        if version is None:
            version = newest + 1
        elif version <= newest:
            raise BillingInputError("version", f"{name} has v{newest}: a new version is above it")
        effective_to = None
        for old in versions:
            if old.effective_to is None or old.effective_to > effective_from:
                effective_to = old.effective_to
                old.effective_to = effective_from
                old.save(update_fields=["effective_to"])
        book = PriceBook.objects.create(
            name=name,
            version=version,
            tier=tier,
            currency=currency,
            effective_from=effective_from,
            effective_to=effective_to,
            **fees,
        )
        _prices_write(book, rows)
    return book


def price_book_version_update(
    *, book: PriceBook, now: datetime | None = None, **changes
) -> PriceBook:
    """Edit a version not yet in force: its start (the version it
    supersedes closes at the new one), its fees, its prices (`prices`
    replaces them all). One in force or past: PriceVersionInForceError."""
    unknown = set(changes) - set(EDITABLE)
    if unknown:
        raise BillingInputError(
            sorted(unknown)[0], "cannot be changed: a version of another name, tier or currency"
        )
    fees = {f: unit_price(changes[f], field=f) for f in FEES if f in changes}
    rows = prices_checked(changes["prices"]) if "prices" in changes else None
    moment = moment_checked(changes["effective_from"]) if "effective_from" in changes else None
    with advisory_xact_lock(PRICES_LOCK):
        book = PriceBook.objects.select_for_update().get(pk=book.pk)
        if book.in_force_or_past(now):
            raise PriceVersionInForceError(book)
        if moment is not None and moment != book.effective_from:
            _move(book, moment, now=now)
        for field, value in fees.items():
            setattr(book, field, value)
        book.save()
        if rows is not None:
            for price in book.prices.all():
                price.delete()
            _prices_write(book, rows)
    return book


def price_book_version_withdraw(*, book: PriceBook, now: datetime | None = None) -> None:
    """Withdraw a version not yet in force: the version it superseded runs
    on as it did before."""
    with advisory_xact_lock(PRICES_LOCK):
        book = PriceBook.objects.select_for_update().get(pk=book.pk)
        if book.in_force_or_past(now):
            raise PriceVersionInForceError(book)
        for before in _superseded(book):
            before.effective_to = book.effective_to
            before.save(update_fields=["effective_to"])
        for price in book.prices.all():
            price.delete()
        book.delete()


def _move(book: PriceBook, moment: datetime, *, now: datetime | None) -> None:
    """Move a scheduled version's start, and the end of the one before it."""
    terms_change_check(moment=moment, now=now)
    before = _superseded(book)
    if before and moment <= before[0].effective_from:
        raise BillingInputError(
            "effective_from",
            f"must be after {book.name} v{before[0].version}'s start "
            f"({before[0].effective_from:%Y-%m-%d %H:%M} UTC)",
        )
    if book.effective_to is not None and moment >= book.effective_to:
        raise BillingInputError(
            "effective_from",
            f"must be before the next version's start ({book.effective_to:%Y-%m-%d %H:%M} UTC)",
        )
    for old in before:
        old.effective_to = moment
        old.save(update_fields=["effective_to"])
    book.effective_from = moment


def _superseded(book: PriceBook) -> list[PriceBook]:
    """The version of the name that `book` closed (ends where it begins)."""
    return list(
        PriceBook.objects.select_for_update()
        .filter(name=book.name, effective_to=book.effective_from)
        .exclude(pk=book.pk)
    )


def _name_checked(name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise BillingInputError("name", "a price book needs a name")
    name = name.strip()
    if len(name) > NAME_MAX:
        raise BillingInputError("name", f"at most {NAME_MAX} characters")
    return name


def prices_checked(prices: Iterable[Mapping]) -> list[dict]:
    """Model prices as a version takes them, each checked, errors naming
    `prices.N.field` (the API's names): `served_model` (a ServedModel),
    the three per-million token prices, `per_gpu_second` (optional), and
    `tiers`: graduated steps ({kind, from_tokens, per_mtok}), each kind's
    first starting at 0."""
    rows: list[dict] = []
    seen: set[int] = set()
    for n, price in enumerate(prices):
        at = f"prices.{n}"
        model = price.get("served_model")
        if not isinstance(model, ServedModel) or model.pk is None:
            raise BillingInputError(f"{at}.served_model", "a served model is needed")
        if model.pk in seen:
            raise BillingInputError(f"{at}.served_model", f"{model.name} is priced twice")
        seen.add(model.pk)
        row = {"served_model": model}
        for field in TOKEN_PRICES:
            row[field] = unit_price(price.get(field), field=f"{at}.{field}")
        row["per_gpu_second"] = unit_price(
            price.get("per_gpu_second"), field=f"{at}.per_gpu_second", optional=True
        )
        row["tiers"] = _tiers_checked(price.get("tiers") or (), at=at)
        rows.append(row)
    return rows


def _tiers_checked(tiers: Iterable[Mapping], *, at: str) -> list[dict]:
    steps: list[dict] = []
    starts: dict[str, set[int]] = {}
    for n, step in enumerate(tiers):
        here = f"{at}.tiers.{n}"
        kind = step.get("kind")
        if kind not in TokenKind.values:
            raise BillingInputError(f"{here}.kind", f"one of {', '.join(TokenKind.values)}")
        start = step.get("from_tokens")
        try:
            start = int(plain_decimal(start if start is not None else "", field="", places=0))
        except (InputError, TypeError):
            raise BillingInputError(
                f"{here}.from_tokens", "a whole number of tokens, 0 or more"
            ) from None
        if start > 2**62:
            raise BillingInputError(f"{here}.from_tokens", "too many tokens")
        if start in starts.setdefault(kind, set()):
            raise BillingInputError(
                f"{here}.from_tokens", f"{kind} has a tier from {start} already"
            )
        starts[kind].add(start)
        per_mtok = unit_price(step.get("per_mtok"), field=f"{here}.per_mtok")
        steps.append({"kind": kind, "from_tokens": start, "per_mtok": per_mtok})
    for kind, kind_starts in starts.items():
        if 0 not in kind_starts:
            raise BillingInputError(f"{at}.tiers", f"the first {kind} tier starts at 0 tokens")
    return steps


def _prices_write(book: PriceBook, rows: list[dict]) -> None:
    for row in rows:
        fields = {k: v for k, v in row.items() if k != "tiers"}
        price = ModelPrice.objects.create(book=book, **fields)
        VolumeTier.objects.bulk_create(VolumeTier(model_price=price, **t) for t in row["tiers"])
