"""Money on pages. `{{ minor|money:currency }}`: integer minor units shown
in currency units; `{{ exact|money_amount:currency }}`: an exact Decimal
amount rounded to the currency's minor units the way invoice lines are
(half-even), with its code; `{{ rate|price:currency }}`: a unit price or
rate, exact, with its code; `{{ figure|amount }}`: a Decimal report figure
grouped by thousands with its places kept (1,784.24), or a dash when
missing. `{{ line|line_quantity }}` and `{{ line|line_unit_price:currency }}`:
an invoice line's quantity and unit price as every copy of the invoice
reads them (billing.invoicing.lines)."""

from decimal import Decimal

from django import template

from billing.invoicing.lines import line_quantity_text, line_unit_price_text
from billing.money import amount_format, money_format, price_format

register = template.Library()

MISSING = "\u2014"


@register.filter
def money(minor: int, currency: str) -> str:
    return money_format(minor, currency)


@register.filter
def money_amount(exact, currency: str) -> str:
    if exact is None or exact == "":
        return MISSING
    return amount_format(Decimal(exact), currency)


@register.filter
def price(rate, currency: str) -> str:
    if rate is None or rate == "":
        return MISSING
    return price_format(Decimal(rate), currency)


@register.filter
def line_quantity(line) -> str:
    return line_quantity_text(line)


@register.filter
def line_unit_price(line, currency: str) -> str:
    return line_unit_price_text(line, currency=currency)


@register.filter
def amount(figure) -> str:
    if figure is None or figure == "":
        return MISSING
    return f"{Decimal(figure):,f}"


@register.filter
def amount_in(figure, currency: str) -> str:
    """A report figure with its currency: "1,784.24 USD"."""
    shown = amount(figure)
    return f"{shown} {currency}" if currency and shown != MISSING else shown
