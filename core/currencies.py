"""ISO 4217: the codes money may be entered in. The active currencies of
the standard's list one (as amended to 2025: XCG beside ANG, ZWG, SLE, VED);
left out are fund codes (BOV, CHE, CHW, CLF, COU, MXV, USN, UYI, UYW),
precious metals, bond-market units and the testing and "no currency"
codes (X..), which no bill or cost is in. A code that only looks like one
("ZZZ", "0") is refused wherever money is entered, naming the field."""

from __future__ import annotations

from django.core.exceptions import ValidationError

ISO_4217 = frozenset({
    "AED", "AFN", "ALL", "AMD", "ANG", "AOA", "ARS", "AUD", "AWG", "AZN", "BAM", "BBD",
    "BDT", "BGN", "BHD", "BIF", "BMD", "BND", "BOB", "BRL", "BSD", "BTN", "BWP", "BYN",
    "BZD", "CAD", "CDF", "CHF", "CLP", "CNY", "COP", "CRC", "CUP", "CVE", "CZK", "DJF",
    "DKK", "DOP", "DZD", "EGP", "ERN", "ETB", "EUR", "FJD", "FKP", "GBP", "GEL", "GHS",
    "GIP", "GMD", "GNF", "GTQ", "GYD", "HKD", "HNL", "HTG", "HUF", "IDR", "ILS", "INR",
    "IQD", "IRR", "ISK", "JMD", "JOD", "JPY", "KES", "KGS", "KHR", "KMF", "KPW", "KRW",
    "KWD", "KYD", "KZT", "LAK", "LBP", "LKR", "LRD", "LSL", "LYD", "MAD", "MDL", "MGA",
    "MKD", "MMK", "MNT", "MOP", "MRU", "MUR", "MVR", "MWK", "MXN", "MYR", "MZN", "NAD",
    "NGN", "NIO", "NOK", "NPR", "NZD", "OMR", "PAB", "PEN", "PGK", "PHP", "PKR", "PLN",
    "PYG", "QAR", "RON", "RSD", "RUB", "RWF", "SAR", "SBD", "SCR", "SDG", "SEK", "SGD",
    "SHP", "SLE", "SOS", "SRD", "SSP", "STN", "SVC", "SYP", "SZL", "THB", "TJS", "TMT",
    "TND", "TOP", "TRY", "TTD", "TWD", "TZS", "UAH", "UGX", "USD", "UYU", "UZS", "VED",
    "VES", "VND", "VUV", "WST", "XAF", "XCD", "XCG", "XOF", "XPF", "YER", "ZAR", "ZMW",
    "ZWG",
})  # fmt: skip


# ISO 4217 minor units where they are not 2 (Stripe's zero-decimal list):
# the decimal places an amount typed in the currency may have
# (core.plain_decimal) and an invoice's minor units (billing.money).
MINOR_EXPONENT = {
    "BIF": 0, "CLP": 0, "DJF": 0, "GNF": 0, "JPY": 0, "KMF": 0, "KRW": 0, "MGA": 0,
    "PYG": 0, "RWF": 0, "UGX": 0, "VND": 0, "VUV": 0, "XAF": 0, "XOF": 0, "XPF": 0,
    "BHD": 3, "JOD": 3, "KWD": 3, "OMR": 3, "TND": 3,
}  # fmt: skip


def minor_exponent(currency: str) -> int:
    return MINOR_EXPONENT.get(currency.upper(), 2)


def currency_is_iso(code: object) -> bool:
    return isinstance(code, str) and code in ISO_4217


def currency_validate(code: object) -> None:
    """A model field's validator (admin, ModelSerializers and services that
    call full_clean all run it): upper-case ISO 4217 or a ValidationError."""
    if not currency_is_iso(code):
        raise ValidationError(
            "%(code)r is not an ISO 4217 currency code (three capital letters, e.g. USD, EUR)",
            code="currency",
            params={"code": code},
        )
