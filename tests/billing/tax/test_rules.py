"""The tax rules by hand (billing.tax.rules): which treatment an invoice
gets, the rate in force on its tax date, a line's tax rounded once per
line half away from zero, a credit note's share, and the ids refused."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from billing.choices import LineKind
from billing.invoicing.lines import LineDraft
from billing.tax.rules import (
    REVERSE_CHARGE_NOTE,
    Buyer,
    Rate,
    TaxInputError,
    Treatment,
    country_clean,
    credit_note_tax_minor,
    line_tax_minor,
    lines_taxed,
    tax_date,
    tax_decide,
    tax_id_clean,
)

FR20 = Rate(1, "FR", "VAT", Decimal(20), date(2020, 1, 1))
FR21 = Rate(2, "FR", "VAT", Decimal(21), date(2026, 11, 1))
AU10 = Rate(3, "AU", "GST", Decimal(10), date(2000, 7, 1))
RATES = [FR20, FR21, AU10]
OCT_31 = date(2026, 10, 31)


def decide(buyer, *, issuer="IE", on=OCT_31):
    return tax_decide(
        issuer_country=issuer, issuer_tax_id="IE6388047V", buyer=buyer, rates=RATES, on=on
    )


def test_the_treatment_follows_where_the_buyer_is_and_who_it_is():
    assert decide(None).treatment == Treatment.NONE  # no profile: no tax, no note
    assert decide(Buyer("FR")).rate == FR20  # a consumer in France: France's VAT
    assert decide(Buyer("FR"), on=date(2026, 11, 30)).rate == FR21  # from its day on
    assert decide(Buyer("FR", tax_id="FR40303265045"), issuer="FR").rate == FR20  # at home
    assert decide(Buyer("AU", tax_id="51824753556")).rate == AU10  # outside the EU: its rate

    reverse = decide(Buyer("DE", tax_id="DE123456789"))
    assert reverse.treatment == Treatment.REVERSE_CHARGE and reverse.rate is None
    assert reverse.note == REVERSE_CHARGE_NOTE.format(buyer="DE123456789", issuer="IE6388047V")
    assert "Article 196" in reverse.note
    # An issuer outside the EU does not reverse-charge: the buyer's rate, none here.
    unset = decide(Buyer("DE", tax_id="DE123456789"), issuer="US")
    assert unset.treatment == Treatment.NONE
    assert unset.warning == "no tax rate for DE on 2026-10-31: no tax charged"

    exempt = decide(Buyer("FR", exempt=True, exempt_reason="diplomatic mission"))
    assert exempt.treatment == Treatment.EXEMPT and exempt.rate is None
    assert exempt.note == "Exempt from tax: diplomatic mission"


def test_the_tax_date_is_the_periods_last_day():
    assert tax_date(datetime(2026, 11, 1, tzinfo=UTC)) == OCT_31


def test_each_line_is_taxed_on_its_billed_amount_rounded_half_away_from_zero():
    assert line_tax_minor(45, Decimal(10)) == 5  # 4.5: half away from zero (half-even: 4)
    assert line_tax_minor(-45, Decimal(10)) == -5  # a credit line the same way down
    assert line_tax_minor(123, Decimal(20)) == 25  # 24.6
    assert line_tax_minor(938, Decimal(20)) == 188  # 187.6
    assert line_tax_minor(1000, Decimal("8.1")) == 81


def test_prepaid_credit_carries_no_tax_and_no_rate_clears_the_tax():
    start, end = datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)

    def line(kind, minor):
        return LineDraft(kind, "x", Decimal(1), None, Decimal(minor), minor, start, end)

    taxed = lines_taxed(
        [line(LineKind.TOKENS, 123), line(LineKind.CREDIT, -50)], decide(Buyer("FR"))
    )
    assert [(t.tax_rate_id, t.tax_minor) for t in taxed] == [(1, 25), (None, 0)]
    cleared = lines_taxed(taxed, decide(Buyer("DE", tax_id="DE123456789")))
    assert [(t.tax_rate_id, t.tax_percent, t.tax_minor) for t in cleared] == [(None, None, 0)] * 2


def test_credit_notes_reverse_their_share_and_together_all_of_it():
    """An invoice of 10.61 + 2.13 tax = 12.74, credited in two halves: 6.37
    carries 6.37 x 2.13 / 12.74 = 1.065 -> 1.07; the second half what is
    left of the tax, 1.06."""
    first = credit_note_tax_minor(
        gross_minor=1274, tax_minor=213, credited_before=0, reversed_before=0, amount=637
    )
    second = credit_note_tax_minor(
        gross_minor=1274, tax_minor=213, credited_before=637, reversed_before=first, amount=637
    )
    assert (first, second) == (107, 106)
    assert (
        credit_note_tax_minor(
            gross_minor=500, tax_minor=0, credited_before=0, reversed_before=0, amount=100
        )
        == 0
    )


@pytest.mark.parametrize(
    ("call", "field", "words"),
    [
        (lambda: country_clean("XX"), "country", "not an ISO 3166-1"),
        (lambda: country_clean(""), "country", "not an ISO 3166-1"),
        (lambda: tax_id_clean("FR123", country="DE"), "tax_id", "starts with DE"),
        (lambda: tax_id_clean("DE1", country="DE"), "tax_id", "2 to 13"),
        (lambda: tax_id_clean("GR123456789", country="GR"), "tax_id", "starts with EL"),
        (lambda: tax_id_clean("?!", country="AU"), "tax_id", "3 to 40"),
    ],
)
def test_a_country_or_tax_id_that_cannot_be_right_is_refused_naming_its_field(call, field, words):
    with pytest.raises(TaxInputError) as refused:
        call()
    assert refused.value.field == field and words in refused.value.message


def test_ids_are_kept_as_written_on_an_invoice():
    assert country_clean(" fr ") == "FR"
    assert tax_id_clean("de 123.456.789", country="DE") == "DE123456789"
    assert tax_id_clean("EL123456789", country="GR") == "EL123456789"
    assert tax_id_clean("51 824 753 556", country="AU") == "51 824 753 556"
