"""Money helpers: an invoice's minor units (cents) per currency, its one
rounding, and how amounts are shown and parsed. Amounts are Decimal at
every boundary and never a float; the exact integer form of a cost is
nano-units (core.nanos)."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

from core.currencies import MINOR_EXPONENT, minor_exponent  # noqa: F401  (billing's names)
from core.errors import InputError
from core.plain_decimal import plain_decimal

# Decimal fields that hold intermediate costs (invariant 1: at least 9 places).
COST = {"max_digits": 28, "decimal_places": 9}
# Digits of an amount typed in minor units: its integer fits a bigint.
MINOR_DIGITS = 18


# A line's unit price as it is kept (InvoiceLine.unit_price): a price
# converted from another currency (1 / 1.08 EUR) is cut to these places.
UNIT_PRICE_PLACES = 9


def unit_price_kept(price: Decimal | None) -> Decimal | None:
    """`price` as an invoice line keeps it (UNIT_PRICE_PLACES, half-even):
    what a line says and what re-rating it compares against (its key)."""
    if price is None:
        return None
    return price.quantize(Decimal(1).scaleb(-UNIT_PRICE_PLACES), rounding=ROUND_HALF_EVEN)


# The one rounding of an invoice line (invariant 1): half to even, so that
# over many lines rounding neither favours the platform nor the tenant.
LINE_ROUNDING = ROUND_HALF_EVEN


def to_minor(amount: Decimal, currency: str) -> int:
    """An exact amount as integer minor units of `currency`, rounded once."""
    scale = Decimal(10) ** minor_exponent(currency)
    return int((Decimal(amount) * scale).quantize(Decimal(1), rounding=LINE_ROUNDING))


def from_minor(minor: int, currency: str) -> Decimal:
    exponent = minor_exponent(currency)
    return Decimal(int(minor)).scaleb(-exponent).quantize(Decimal(1).scaleb(-exponent))


def money_format(minor: int, currency: str) -> str:
    """'1,234.50 USD' — for pages and PDFs, never for arithmetic."""
    return f"{from_minor(minor, currency):,} {currency.upper()}"


def amount_format(amount: Decimal, currency: str) -> str:
    """An exact amount as people read money: rounded to the currency's
    minor units the one way invoice lines are (LINE_ROUNDING), grouped,
    with its code: '956.15 USD'. For display only."""
    return money_format(to_minor(amount, currency), currency)


def price_format(price: Decimal, currency: str) -> str:
    """A unit price or rate with its code, never rounded (it is a term of
    the contract: 0.0000045 a token is not 0.00), but given at least the
    currency's minor places: '0.60 USD', '1,450.00 USD', '0.0002 USD'."""
    exponent = minor_exponent(currency)
    exact = Decimal(price).normalize()
    if exact.as_tuple().exponent > -exponent:  # type: ignore[operator]
        exact = exact.quantize(Decimal(1).scaleb(-exponent))
    return f"{exact:,f} {currency.upper()}"


def minor_parse(text: str, currency: str, *, field: str) -> int:
    """An amount typed by a person ("12.50", "1,450") as minor units,
    read by the one parser (core.plain_decimal): more decimal places than
    the currency has, an exponent, an ambiguous comma, too many digits or
    not a positive amount is an InputError naming `field`."""
    amount = plain_decimal(text, field=field, currency=currency, max_digits=MINOR_DIGITS)
    if amount <= 0:
        raise InputError(field, "must be a positive amount")
    return int(amount.scaleb(minor_exponent(currency)))
