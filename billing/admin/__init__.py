"""Finance staff's admin for billing, a module per subpackage (costs, fx,
pricing, spend, tax, invoicing, reports, payments, sla); Django loads
this package, which loads them all."""

from billing.admin import (  # noqa: F401 (each registers its admins)
    costs,
    fx,
    invoicing,
    payments,
    pricing,
    reports,
    sla,
    spend,
    tax,
)
