"""`{{ minor|money:currency }}`: integer minor units shown in currency units."""

from django import template

from billing.money import money_format

register = template.Library()


@register.filter
def money(minor: int, currency: str) -> str:
    return money_format(minor, currency)
