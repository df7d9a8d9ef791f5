"""The one parser for typed numbers (core.plain_decimal): a table of
inputs to the value read or the refusal's message, and its form and API
fields."""

from decimal import Decimal as D

import pytest
from django import forms

from core.api_decimal import PlainDecimalField as ApiDecimalField
from core.errors import InputError
from core.plain_decimal import PlainDecimalField, plain_decimal

AMBIGUOUS = "is ambiguous: a comma only separates thousands"
EXPONENT = "without an exponent"
NEGATIVE = "must not be negative"
NOT_PLAIN = "is not a number (plain digits"


@pytest.mark.parametrize(
    ("text", "options", "expected"),
    [
        ("12.50", {"currency": "USD"}, D("12.50")),
        ("  12.5 ", {"currency": "USD"}, D("12.5")),
        ("1,450.00", {"currency": "USD"}, D("1450.00")),
        ("1,450", {"currency": "JPY"}, D("1450")),
        ("1,234,567.89", {"currency": "USD"}, D("1234567.89")),
        ("0.05", {"currency": "USD"}, D("0.05")),
        (".5", {"places": 2}, D("0.5")),
        ("1.500", {"currency": "USD"}, D("1.500")),  # a trailing zero is no place too many
        ("1450.0", {"currency": "JPY"}, D("1450.0")),
        ("0.001", {"currency": "KWD"}, D("0.001")),
        ("-2.5", {"places": 2, "signed": True}, D("-2.5")),
        ("-0", {"places": 2, "signed": True}, D("0")),
        ("99999999999999.99", {"places": 2, "max_digits": 16}, D("99999999999999.99")),
        ("20", {"places": 4, "max_digits": 7}, D("20")),
        (D("8.1"), {"places": 4}, D("8.1")),
        (7, {"places": 0}, D(7)),
    ],
)
def test_plain_decimals_are_read(text, options, expected):
    value = plain_decimal(text, field="amount", **options)
    assert value == expected and isinstance(value, D)


@pytest.mark.parametrize(
    ("text", "options", "message"),
    [
        ("1,50", {"currency": "USD"}, AMBIGUOUS),
        ("100,00", {"currency": "USD"}, AMBIGUOUS),
        ("1,4500.00", {"currency": "USD"}, AMBIGUOUS),
        ("12,5", {"places": 4}, AMBIGUOUS),
        ("1e2", {"currency": "USD"}, EXPONENT),
        ("1e1", {"places": 4}, EXPONENT),
        ("1E+30", {"currency": "USD"}, EXPONENT),
        ("2.5e-3", {"places": 4}, EXPONENT),
        ("-5", {"currency": "USD"}, NEGATIVE),
        ("-1,450.00", {"currency": "USD"}, NEGATIVE),
        ("1.5", {"currency": "JPY"}, "JPY has 0 decimal places: 1.5 has 1"),
        ("12.505", {"currency": "USD"}, "USD has 2 decimal places"),
        ("0.12345", {"places": 4}, "at most 4 decimal places"),
        ("1" * 27, {"currency": "USD", "max_digits": 18}, "too many digits: at most 16 before"),
        ("123", {"places": 2, "max_digits": 4}, "too many digits: at most 2 before"),
        ("9" * 101, {"places": 2}, "too many digits"),
        ("", {"places": 2}, "a number is needed"),
        ("   ", {"places": 2}, "a number is needed"),
        ("lots", {"places": 2}, NOT_PLAIN),
        ("NaN", {"places": 2}, NOT_PLAIN),
        ("Infinity", {"places": 2}, NOT_PLAIN),
        ("1 450", {"places": 2}, NOT_PLAIN),
        ("1.2.3", {"places": 2}, NOT_PLAIN),
        ("5.", {"places": 2}, NOT_PLAIN),
        ("+5", {"places": 2}, NOT_PLAIN),
        ("0x10", {"places": 2}, NOT_PLAIN),
        ("١٢", {"places": 2}, NOT_PLAIN),  # digits, but not ASCII ones
        (1.5, {"places": 2}, "is not a number"),  # a float is never money
        (D("-1"), {"places": 2}, NEGATIVE),
        (D("NaN"), {"places": 2}, "is not a number"),
        (D("1.5"), {"currency": "JPY"}, "JPY has 0 decimal places"),
    ],
)
def test_anything_else_is_refused_naming_the_field(text, options, message):
    with pytest.raises(InputError) as refused:
        plain_decimal(text, field="amount", **options)
    assert refused.value.field == "amount"
    assert message in refused.value.message


class _Form(forms.Form):
    percent = PlainDecimalField(max_digits=7, decimal_places=4, required=False)
    budget = PlainDecimalField(max_digits=20, decimal_places=4, min_value=0, required=False)


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"percent": "1e2"}, "percent", EXPONENT),
        ({"percent": "8,1"}, "percent", AMBIGUOUS),
        ({"budget": "-5"}, "budget", NEGATIVE),
        ({"budget": "1" * 27}, "budget", "too many digits"),
    ],
)
def test_the_form_field_refuses_as_the_parser_does(data, field, message):
    form = _Form(data)
    assert not form.is_valid()
    assert message in form.errors[field][0]


def test_the_form_field_reads_plain_decimals_with_its_places():
    form = _Form({"percent": "-8.10000", "budget": "1,450.5"})
    assert form.is_valid(), form.errors
    assert form.cleaned_data == {"percent": D("-8.1000"), "budget": D("1450.5000")}
    assert _Form().fields["budget"].widget.input_type == "text"  # no browser-side number rules


@pytest.mark.parametrize(
    ("data", "result"),
    [
        ("1,450.00", D("1450.00")),
        (12, D("12.00")),
        (1.5, D("1.50")),
        ("1e2", EXPONENT),
        (1e30, EXPONENT),  # a JSON number too big for plain digits
        ("1,50", AMBIGUOUS),
        ("-1", NEGATIVE),
        ("1" * 27, "too many digits"),
        (True, "A valid number is required."),
        ({"amount": 1}, "A valid number is required."),
    ],
)
def test_the_api_field_reads_as_the_parser_does(data, result):
    field = ApiDecimalField(max_digits=20, decimal_places=2, min_value=0)
    field.bind("amount", None)
    if isinstance(result, D):
        assert field.run_validation(data) == result
    else:
        from rest_framework.exceptions import ValidationError

        with pytest.raises(ValidationError) as refused:
            field.run_validation(data)
        assert result in str(refused.value.detail[0])


OUR_APPS = ("tenants", "serving", "metering", "billing", "audit", "webhooks", "planning")


def _editable_decimals():
    """(admin, field) for every model DecimalField our admins let a person
    type into, inlines included."""
    from django.contrib import admin
    from django.contrib.auth import get_user_model
    from django.db import models
    from django.test import RequestFactory

    request = RequestFactory().get("/admin/")
    request.user = get_user_model()(is_superuser=True, is_active=True)
    for model_admin in admin.site._registry.values():
        if not type(model_admin).__module__.startswith(OUR_APPS):
            continue
        owners = [model_admin, *(i(model_admin.model, admin.site) for i in model_admin.inlines)]
        for owner in owners:
            if owner is model_admin:
                typed = owner.has_add_permission(request) or owner.has_change_permission(request)
            else:
                typed = owner.has_add_permission(request, None) or owner.has_change_permission(
                    request
                )
            if not typed:
                continue
            shown = set(owner.get_fields(request)) - set(owner.get_readonly_fields(request))
            for field in owner.model._meta.get_fields():
                if isinstance(field, models.DecimalField) and field.name in shown:
                    yield owner, field, request


def test_every_admin_reads_typed_decimals_with_the_one_parser():
    checked = [
        (type(owner).__name__, field.name)
        for owner, field, request in _editable_decimals()
        if not isinstance(owner.formfield_for_dbfield(field, request), PlainDecimalField)
    ]
    assert checked == []
    assert len(list(_editable_decimals())) > 20  # the prices, rates, budgets and percents
