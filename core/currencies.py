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
