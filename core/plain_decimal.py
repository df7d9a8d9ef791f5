"""The one parser for a number a person types: an amount of money, a
price, a rate or a percent, in every form, the admin, the API
(core.api_decimal) and the commands (invariant 7).

Plain decimals only: digits, at most one decimal point, and a minus
where the field takes one. A comma is read only as a thousands separator
in whole groups of three ("1,450.00"); "1,50" and "100,00" are refused as
ambiguous (the comma is Europe's decimal mark), never guessed. An
exponent ("1e2"), too many digits for the field, more decimal places than
it keeps (a currency's minor units: JPY has none) or a minus where none
belongs is refused, naming the field. Decimal only, never a float."""

from __future__ import annotations

import re
from decimal import Context, Decimal

from django import forms
from django.db import models

from core.currencies import minor_exponent
from core.errors import InputError

_PLAIN = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d*)(?:\.\d+)?", re.ASCII)
_COMMA_MARK = re.compile(r"-?[\d,]*\d(?:\.\d+)?", re.ASCII)  # digits and commas, grouped wrong
_EXPONENT = re.compile(r"[-+]?[\d.,]*\d[eE][-+]?\d*", re.ASCII)
TEXT_MAX = 100  # longer than any amount a field keeps
NEGATIVE = "must not be negative (no minus here)"


def plain_decimal(
    value: str | int | Decimal,
    *,
    field: str,
    places: int | None = None,
    max_digits: int | None = None,
    signed: bool = False,
    currency: str | None = None,
) -> Decimal:
    """`value` (text as typed, or an int or Decimal already read) as a
    Decimal, or an InputError naming `field`. `places` and `max_digits`:
    the field's decimal places and its digits in all, as Django's
    DecimalField has them (`places` defaults to the currency's minor
    units); an amount in `currency` has no more places than its minor
    units either. `signed`: whether a minus belongs there."""
    minor = None if currency is None else minor_exponent(currency)
    kept = places if places is not None else minor
    whole = None if max_digits is None else max_digits - (kept or 0)
    if minor is not None and kept is not None:
        kept = min(kept, minor)
    if isinstance(value, str):
        value = _read(value, field=field, signed=signed)
    elif isinstance(value, int) and not isinstance(value, bool):
        value = Decimal(value)
    elif not isinstance(value, Decimal):
        raise InputError(field, f"{value!r} is not a number")
    return _checked(value, field=field, places=kept, whole=whole, signed=signed, currency=currency)


def _read(text: str, *, field: str, signed: bool) -> Decimal:
    text = text.strip()
    shown = text if len(text) <= 40 else f"{text[:40]}…"
    if not text:
        raise InputError(field, "a number is needed")
    if len(text) > TEXT_MAX:
        raise InputError(field, f"too many digits ({len(text)} characters)")
    if _EXPONENT.fullmatch(text):
        raise InputError(field, f"{shown!r}: write the number in plain digits, without an exponent")
    if text.startswith("-") and not signed:
        raise InputError(field, NEGATIVE)
    if not _PLAIN.fullmatch(text) or not any("0" <= c <= "9" for c in text):
        if "," in text and _COMMA_MARK.fullmatch(text):
            raise InputError(
                field,
                f"{shown!r} is ambiguous: a comma only separates thousands, in groups of "
                f"three (1,450.00); write the decimal mark as a point (1.50)",
            )
        raise InputError(field, f"{shown!r} is not a number (plain digits, e.g. 1450.00)")
    return Decimal(text.replace(",", ""))


def _checked(value: Decimal, *, field, places, whole, signed, currency) -> Decimal:
    if not value.is_finite():
        raise InputError(field, f"{value} is not a number")
    if value.is_signed() and not value.is_zero() and not signed:
        raise InputError(field, NEGATIVE)
    _, digits, exponent = value.as_tuple()
    digits = list(digits)
    while exponent < 0 and len(digits) > 1 and digits[-1] == 0:  # 1.50 has 1 place
        digits.pop()
        exponent += 1
    used = max(0, -exponent)  # type: ignore[operator]
    if places is not None and used > places:
        if currency is not None:
            raise InputError(
                field, f"{currency.upper()} has {places} decimal places: {value} has {used}"
            )
        raise InputError(field, f"at most {places} decimal places")
    if whole is not None and len(digits) + exponent > whole:  # type: ignore[operator]
        raise InputError(field, f"too many digits: at most {whole} before the decimal point")
    return abs(value) if value.is_zero() else value


class PlainDecimalField(forms.DecimalField):
    """A form's (and the admin's, through PLAIN_DECIMALS) decimal field,
    read by `plain_decimal`: a typed "1e2" or "1,50" is refused. A minus is
    taken only when `signed`, by default when the field has no lower bound
    of 0 or more."""

    widget = forms.TextInput(attrs={"inputmode": "decimal"})

    def __init__(self, *, signed: bool | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.signed = (self.min_value is None or self.min_value < 0) if signed is None else signed

    def to_python(self, value):
        if value in self.empty_values:
            return None
        try:
            value = plain_decimal(
                value if isinstance(value, (int, Decimal)) else str(value),
                field="",
                places=self.decimal_places,
                max_digits=self.max_digits,
                signed=self.signed,
            )
        except InputError as error:
            raise forms.ValidationError(error.message, code="invalid") from None
        return places_kept(value, self.decimal_places)

    def widget_attrs(self, widget):
        return forms.Field.widget_attrs(self, widget)  # no number input's step


def places_kept(value: Decimal, places: int | None) -> Decimal:
    """A checked value written with the field's places ("1.500" is 1.50),
    so no later check counts a trailing zero as a place too many."""
    if places is None:
        return value
    prec = max(28, value.adjusted() + places + 2)
    return value.quantize(Decimal(1).scaleb(-places), context=Context(prec=prec))


# A ModelAdmin's (or inline's) `formfield_overrides`: every model
# DecimalField it edits is read by `plain_decimal`.
PLAIN_DECIMALS = {models.DecimalField: {"form_class": PlainDecimalField}}
