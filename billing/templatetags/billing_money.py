"""Money on pages. `{{ minor|money:currency }}`: integer minor units shown
in currency units; `{{ figure|amount }}`: a Decimal report figure grouped
by thousands with its places kept (1,784.24), or a dash when missing."""

from decimal import Decimal

from django import template

from billing.money import money_format

register = template.Library()


@register.filter
def money(minor: int, currency: str) -> str:
    return money_format(minor, currency)


@register.filter
def amount(figure) -> str:
    if figure is None or figure == "":
        return "\u2014"
    return f"{Decimal(figure):,f}"


@register.filter
def amount_in(figure, currency: str) -> str:
    """A report figure with its currency: "1,784.24 USD"."""
    shown = amount(figure)
    return f"{shown} {currency}" if currency and shown != "\u2014" else shown
