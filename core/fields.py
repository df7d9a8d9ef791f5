"""Model fields that carry the input rules every way in shares: a date or
time within the supported span (core.calendar), a currency in ISO 4217
(core.currencies). Their validators run wherever a model is validated: the
admin's forms, DRF's ModelSerializers and services that call full_clean,
with the message the API's fields give (core.api_time).

The validators are the fields' defaults, not a `validators` argument, and
the fields deconstruct as Django's own: the rule is code, not schema, so
no migration records it."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models

from core.calendar import OUT_OF_RANGE, moment_supported
from core.currencies import currency_validate


def moment_validate(value) -> None:
    """A validator: a date or datetime within the supported span."""
    if value is not None and not moment_supported(value):
        raise ValidationError(OUT_OF_RANGE, code="out_of_range")


class _AsDjangos:
    """Deconstructs as the Django field it extends (see the module's note)."""

    def deconstruct(self):
        name, _path, args, kwargs = super().deconstruct()
        base = next(c for c in type(self).__mro__ if c.__module__.startswith("django.db.models"))
        return name, f"django.db.models.{base.__name__}", args, kwargs


class SupportedDateField(_AsDjangos, models.DateField):
    default_validators = [moment_validate]


class SupportedDateTimeField(_AsDjangos, models.DateTimeField):
    default_validators = [moment_validate]


class CurrencyField(_AsDjangos, models.CharField):
    """Three capital letters of ISO 4217."""

    default_validators = [currency_validate]

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("max_length", 3)
        super().__init__(*args, **kwargs)
