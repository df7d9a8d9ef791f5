"""How amounts read on pages: grouped by thousands, places kept, a dash for
a missing figure; never rounded again on the way to the page."""

from decimal import Decimal

import pytest

from billing.templatetags.billing_money import amount, money


@pytest.mark.parametrize(
    ("figure", "shown"),
    [
        (Decimal("1784.24"), "1,784.24"),
        ("-1234567.50", "-1,234,567.50"),
        (Decimal("0.000000001"), "0.000000001"),
        (Decimal("12.345678901"), "12.345678901"),
        (None, "\u2014"),
        ("", "\u2014"),
    ],
)
def test_a_report_figure_is_grouped_with_its_places_kept(figure, shown):
    assert amount(figure) == shown


def test_minor_units_show_in_the_currency_grouped():
    assert money(123456789, "usd") == "1,234,567.89 USD"
    assert money(1234567, "JPY") == "1,234,567 JPY"
