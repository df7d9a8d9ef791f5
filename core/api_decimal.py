"""The API's decimal field, read by the one parser (core.plain_decimal):
DRF's own DecimalField takes "1e2" as 100 and "1E+30" as a number, so
every serializer that takes an amount, a price, a rate or a percent uses
this one, and its refusal is a 400 naming the field, with the message a
page's form gives."""

from __future__ import annotations

from decimal import Decimal

from rest_framework import serializers

from core.errors import InputError
from core.plain_decimal import places_kept, plain_decimal


class PlainDecimalField(serializers.DecimalField):
    """A DecimalField that takes plain decimals only: a string ("1450.00",
    "1,450.00") or a JSON integer; a JSON number with a fraction is read
    from its shortest form (1.5 is "1.5"; 1e30 is refused as an exponent).
    A minus is taken only when `signed`, by default when the field has no
    lower bound of 0 or more."""

    def __init__(self, *args, signed: bool | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.signed = (self.min_value is None or self.min_value < 0) if signed is None else signed

    def to_internal_value(self, data) -> Decimal:
        if isinstance(data, bool) or not isinstance(data, str | int | float | Decimal):
            self.fail("invalid")
        if isinstance(data, float):
            data = repr(data)
        try:
            value = plain_decimal(
                data,
                field=self.field_name or "",
                places=self.decimal_places,
                max_digits=self.max_digits,
                signed=self.signed,
            )
        except InputError as error:
            raise serializers.ValidationError(error.message, code="invalid") from None
        return places_kept(value, self.decimal_places)
