"""Billing's models: the cost side (rates, allocation runs and results) and
the price side (price books, plans, subscriptions, credits), invoices,
the tenants' Stripe customers, and service levels (SLO policies, SLA
credit schedules, finance's decisions on credits), and tax (tenants'
profiles, dated rates)."""

from billing.models.budgets import BudgetState, SpendCorrection  # noqa: F401
from billing.models.costs import (  # noqa: F401
    AllocationRun,
    CostAllocation,
    CostPeriodReopening,
    CostRate,
    CostScenario,
    PoolHourCost,
)
from billing.models.fx import FxRate  # noqa: F401
from billing.models.invoices import (  # noqa: F401
    CreditApplication,
    CreditNote,
    Invoice,
    InvoiceLine,
    InvoiceRun,
    Issuer,
    ReproductionCheck,
    StripeEvent,
)
from billing.models.payments import StripeCustomer  # noqa: F401
from billing.models.prices import (  # noqa: F401
    CreditGrant,
    ModelPrice,
    Plan,
    PriceBook,
    Subscription,
    VolumeTier,
)
from billing.models.reports import MarginReport  # noqa: F401
from billing.models.sla import SlaCreditAdjustment, SlaCreditRule, SloPolicy  # noqa: F401
from billing.models.tax import TaxDetailsRequest, TaxProfile, TaxRate  # noqa: F401
