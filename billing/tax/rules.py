"""How tax is decided for an invoice, and computed on its lines: pure
rules, no database.

The decision (`tax_decide`), from the issuer's country, the buyer's tax
profile and the rates in force on the invoice's tax date (the last day
of its service period: a continuous supply is taxed when it ends):

- no profile, or none with a country: no tax (treatment "");
- exempt: no tax, and the invoice says why (finance records the reason);
- an EU issuer selling to a business (a VAT id) established in another EU
  country: reverse charge. No VAT is charged; the buyer accounts for it,
  and the invoice says so and names both VAT ids (Article 196 and 226(11a)
  of Council Directive 2006/112/EC);
- otherwise the buyer's country's rate in force on the tax date (services
  to a consumer, or to a business at home, are taxed where the buyer is:
  the EU's place-of-supply rule for electronic services, and Australia's,
  Singapore's, the UK's likewise). A country with no rate configured is
  not taxed, and the invoice carries a warning saying so: the operator
  collects tax only where it has set a rate (where it is registered).

One rate per invoice, then: the buyer's. Each taxable line's tax is its
billed amount (whole minor units) times the rate, rounded once per line,
half away from zero (TAX_ROUNDING: commercial rounding, as VAT
authorities ask of an invoice line and as Stripe computes a line's tax);
the invoice's tax is the sum of its lines'. Prepaid credit is applied to
the total after tax, as money (Stripe applies a customer's balance the
same way): it carries none.

A credit note reverses its share of the invoice's tax: the tax on what
has been credited so far, cumulatively, less what earlier notes reversed,
so that notes crediting the whole invoice reverse all its tax to the cent."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from billing.choices import LineKind

TAX_ROUNDING = ROUND_HALF_UP  # ties away from zero


class Treatment:
    NONE = ""
    STANDARD = "standard"
    REVERSE_CHARGE = "reverse_charge"
    EXEMPT = "exempt"
    # Tax is due (the buyer is in the issuer's country, or both are in the
    # EU) but no rate is configured for the buyer's country: never finalized.
    RATE_MISSING = "rate_missing"


# ISO 3166-1 alpha-2, officially assigned.
_COUNTRY_CODES = (
    "AD AE AF AG AI AL AM AO AQ AR AS AT AU AW AX AZ BA BB BD BE BF BG BH BI BJ BL BM BN BO BQ "
    "BR BS BT BV BW BY BZ CA CC CD CF CG CH CI CK CL CM CN CO CR CU CV CW CX CY CZ DE DJ DK DM "
    "DO DZ EC EE EG EH ER ES ET FI FJ FK FM FO FR GA GB GD GE GF GG GH GI GL GM GN GP GQ GR GS "
    "GT GU GW GY HK HM HN HR HT HU ID IE IL IM IN IO IQ IR IS IT JE JM JO JP KE KG KH KI KM KN "
    "KP KR KW KY KZ LA LB LC LI LK LR LS LT LU LV LY MA MC MD ME MF MG MH MK ML MM MN MO MP MQ "
    "MR MS MT MU MV MW MX MY MZ NA NC NE NF NG NI NL NO NP NR NU NZ OM PA PE PF PG PH PK PL PM "
    "PN PR PS PT PW PY QA RE RO RS RU RW SA SB SC SD SE SG SH SI SJ SK SL SM SN SO SR SS ST SV "
    "SX SY SZ TC TD TF TG TH TJ TK TL TM TN TO TR TT TV TW TZ UA UG UM US UY UZ VA VC VE VG VI "
    "VN VU WF WS YE YT ZA ZM ZW "
)
COUNTRIES = frozenset(_COUNTRY_CODES.split())
EU = frozenset(
    "AT BE BG CY CZ DE DK EE ES FI FR GR HR HU IE IT LT LU LV MT NL PL PT RO SE SI SK".split()  # noqa: SIM905
)
# An EU VAT id starts with its country's code (Greece's is EL), then 2-13
# letters and digits; elsewhere an id is 3-40 letters, digits and - . /.
VAT_PREFIX = {"GR": "EL"}
EU_VAT_ID = re.compile(r"^[A-Z]{2}[0-9A-Z+*]{2,13}$")
OTHER_TAX_ID = re.compile(r"^[0-9A-Z][0-9A-Z./ -]{1,38}[0-9A-Z]$")

REVERSE_CHARGE_NOTE = (
    "Reverse charge: VAT to be accounted for by the recipient (Article 196, Council "
    "Directive 2006/112/EC). Customer VAT ID {buyer}; supplier VAT ID {issuer}."
)
EXEMPT_NOTE = "Exempt from tax: {reason}"


class TaxInputError(ValueError):
    """A country or tax id that cannot be right: (field, message)."""

    def __init__(self, field: str, message: str) -> None:
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


def country_clean(value: str | None, *, field: str = "country") -> str:
    country = (value or "").strip().upper()
    if country not in COUNTRIES:
        raise TaxInputError(field, f"{value!r} is not an ISO 3166-1 alpha-2 country code")
    return country


def tax_id_clean(value: str | None, *, country: str) -> str:
    """The id as stored: upper case, no spaces or dots in an EU VAT id; ""
    for none. An EU VAT id must start with its country's prefix."""
    raw = (value or "").strip().upper()
    if not raw:
        return ""
    if country in EU:
        compact = re.sub(r"[\s.-]", "", raw)
        prefix = VAT_PREFIX.get(country, country)
        if not compact.startswith(prefix):
            raise TaxInputError(
                "tax_id", f"an EU VAT id for {country} starts with {prefix} (got {value!r})"
            )
        if not EU_VAT_ID.match(compact):
            raise TaxInputError(
                "tax_id", f"{value!r} is not a VAT id: {prefix} then 2 to 13 letters or digits"
            )
        return compact
    if not OTHER_TAX_ID.match(raw):
        raise TaxInputError(
            "tax_id", f"{value!r} is not a tax id: 3 to 40 letters, digits, spaces, - . /"
        )
    return raw


@dataclass(frozen=True)
class Buyer:
    """A tenant's tax profile as the rules read it."""

    country: str
    tax_id: str = ""
    exempt: bool = False
    exempt_reason: str = ""


@dataclass(frozen=True)
class Rate:
    """A rate as the rules read it."""

    id: int
    country: str
    name: str
    percent: Decimal
    valid_from: date

    @property
    def label(self) -> str:
        return f"{self.name} {self.percent.normalize():f}% ({self.country})"


@dataclass(frozen=True)
class TaxDecision:
    treatment: str
    rate: Rate | None = None
    note: str = ""
    buyer: Buyer | None = None
    warning: str = ""


NO_TAX = TaxDecision(Treatment.NONE)


def tax_date(period_end: datetime) -> date:
    """The tax date of a period [start, end): its last day."""
    return (period_end - timedelta(microseconds=1)).date()


def rate_on(rates: list[Rate], *, country: str, on: date) -> Rate | None:
    """The country's rate in force on `on`: the latest that began by then."""
    found = [r for r in rates if r.country == country and r.valid_from <= on]
    return max(found, key=lambda r: r.valid_from, default=None)


def tax_decide(
    *,
    issuer_country: str,
    issuer_tax_id: str,
    buyer: Buyer | None,
    rates: list[Rate],
    on: date,
) -> TaxDecision:
    """The invoice's tax treatment (the module's docstring)."""
    if buyer is None or not buyer.country:
        return NO_TAX
    if buyer.exempt:
        note = EXEMPT_NOTE.format(reason=buyer.exempt_reason)
        return TaxDecision(Treatment.EXEMPT, note=note, buyer=buyer)
    if (
        buyer.tax_id
        and issuer_country in EU
        and buyer.country in EU
        and buyer.country != issuer_country
    ):
        note = REVERSE_CHARGE_NOTE.format(buyer=buyer.tax_id, issuer=issuer_tax_id or "—")
        return TaxDecision(Treatment.REVERSE_CHARGE, note=note, buyer=buyer)
    rate = rate_on(rates, country=buyer.country, on=on)
    if rate is None:
        due = buyer.country == issuer_country or (issuer_country in EU and buyer.country in EU)
        if not due:  # outside the issuer's tax: no tax, as before
            warning = f"no tax rate for {buyer.country} on {on:%Y-%m-%d}: no tax charged"
            return TaxDecision(Treatment.NONE, buyer=buyer, warning=warning)
        warning = (
            f"no tax rate for {buyer.country} on {on:%Y-%m-%d}: tax is due there, so this "
            "invoice is not finalized until one is added"
        )
        return TaxDecision(Treatment.RATE_MISSING, buyer=buyer, warning=warning)
    return TaxDecision(Treatment.STANDARD, rate=rate, buyer=buyer)


def line_tax_minor(amount_minor: int, percent: Decimal) -> int:
    """A line's tax: its billed amount times the rate, rounded once."""
    return int((Decimal(amount_minor) * percent / 100).quantize(Decimal(1), TAX_ROUNDING))


def lines_taxed(lines: list, decision: TaxDecision) -> list:
    """The lines (LineDrafts) with their tax set as the decision says; a
    prepaid credit line carries none."""
    rate = decision.rate
    if rate is None:
        return [replace(line, tax_rate_id=None, tax_percent=None, tax_minor=0) for line in lines]
    return [
        line
        if line.kind == LineKind.CREDIT
        else replace(
            line,
            tax_rate_id=rate.id,
            tax_percent=rate.percent,
            tax_minor=line_tax_minor(line.amount_minor, rate.percent),
        )
        for line in lines
    ]


def credit_note_tax_minor(
    *, gross_minor: int, tax_minor: int, credited_before: int, reversed_before: int, amount: int
) -> int:
    """The tax a credit note of `amount` reverses, on an invoice of
    `gross_minor` (subtotal plus tax) carrying `tax_minor`: the tax share of
    all credited so far, rounded once (TAX_ROUNDING), less what earlier
    notes reversed. Notes crediting the whole gross reverse all its tax."""
    if tax_minor == 0 or gross_minor == 0:
        return 0
    credited = credited_before + amount
    share = (Decimal(credited) * tax_minor / gross_minor).quantize(Decimal(1), TAX_ROUNDING)
    return int(min(share, tax_minor)) - reversed_before
