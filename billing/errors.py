"""Errors billing's services raise; the API maps them to HTTP statuses
(through core's base classes)."""

from core.errors import ConflictError, InputError


class InvoiceStateError(ConflictError):
    """The invoice is not in a state that allows this (409)."""

    code = "invoice_state"


class InvoicePeriodOpenError(InvoiceStateError):
    """Finalizing an invoice whose billing period has not ended, without
    asking to finalize early (409): the message names the period's end."""

    code = "period_not_ended"

    def __init__(self, *, period_start, period_end) -> None:
        self.period_start, self.period_end = period_start, period_end
        super().__init__(
            f"the billing period {period_start:%Y-%m-%d} to {period_end:%Y-%m-%d} has not "
            f"ended (it ends {period_end:%Y-%m-%d %H:%M} UTC): an invoice for it is finalized "
            f"only when asked to finalize early, with a reason"
        )


class CostPeriodClosedError(ConflictError):
    """A dated cost change inside a period already invoiced (409): re-running
    it would change cost booked and reported; finance reopens it first."""

    code = "cost_period_closed"

    def __init__(self, *, effective_from, closed_until) -> None:
        self.effective_from, self.closed_until = effective_from, closed_until
        super().__init__(
            f"effective_from: {effective_from:%Y-%m-%d %H:%M} UTC is inside the closed cost "
            f"period (invoiced up to {closed_until:%Y-%m-%d %H:%M} UTC); finance reopens it, "
            f"with a reason, before a rate can take effect there"
        )


class BillingInputError(InputError):
    """Bad input to a billing service, naming the field (400)."""


class FxError(ConflictError):
    """Money in two currencies that cannot be put into one (409): a margin
    report fails with this message rather than adding them 1:1."""

    code = "fx"


class FxRateMissingError(FxError):
    """No exchange rate for a currency pair on a day a report needs."""

    code = "fx_rate_missing"

    def __init__(self, base: str, quote: str, day, lookback_days: int) -> None:
        self.base, self.quote, self.day = base, quote, day
        super().__init__(
            f"no {base}/{quote} exchange rate for {day:%Y-%m-%d} (nor in the "
            f"{lookback_days} days before): enter one (admin, POST /api/v1/fx-rates) or "
            f"import reference rates (manage.py fx_rates_import)"
        )


class CostCurrencyError(FxError):
    """Cost entered in a currency other than the reporting currency."""

    code = "cost_currency"


class PriceVersionInForceError(ConflictError):
    """A price book version (or its prices) in force or past, asked to
    change (409): history is priced by it, so a change is a new version
    from a date."""

    code = "price_version_in_force"

    def __init__(self, book) -> None:
        self.book = book
        super().__init__(
            f"{book.name} v{book.version} is in force since "
            f"{book.effective_from:%Y-%m-%d %H:%M} UTC and is never edited: "
            f"create a new version from a date"
        )


class TaxRateMissingError(InvoiceStateError):
    """A draft for a buyer whose country has no tax rate, asked to be
    finalized (409): the message names the country."""

    code = "tax_rate_missing"


class PlanInUseError(ConflictError):
    """A plan a started subscription uses, asked to change (409): its terms
    priced those months, so new terms are a new plan, and subscriptions
    move to it from a date."""

    code = "plan_in_use"

    def __init__(self, plan) -> None:
        self.plan = plan
        super().__init__(
            f"plan {plan.name} has subscriptions already started and is never edited: "
            f"create a new plan and move the subscriptions to it from a date"
        )


class SubscriptionStartedError(ConflictError):
    """A subscription already started, asked to change other than ending
    from now on (409): a move to another plan ends it and starts another."""

    code = "subscription_started"

    def __init__(self, subscription) -> None:
        self.subscription = subscription
        super().__init__(
            f"{subscription.tenant.slug}'s subscription to {subscription.plan.name} started "
            f"{subscription.start:%Y-%m-%d %H:%M} UTC and is never edited: move the tenant "
            f"to a plan from a date"
        )


class TermsDatedError(ConflictError):
    """A dated change of prices, plans or subscriptions that would reprice
    what already happened (409): taking effect in a closed (invoiced)
    period not reopened (`closed_until` set), or before the current hour.
    The message names the field."""

    code = "terms_backdated"

    def __init__(self, *, field: str, moment, closed_until=None, hour=None) -> None:
        self.field, self.moment, self.closed_until = field, moment, closed_until
        if closed_until is not None:
            self.code = "price_period_closed"
            why = (
                f"is inside the closed period (invoiced up to {closed_until:%Y-%m-%d %H:%M} UTC), "
                f"whose re-rating must reproduce its finalized invoices; finance reopens it, "
                f"with a reason, before a change can take effect there"
            )
        else:
            why = (
                f"is before the current hour ({hour:%Y-%m-%d %H:%M} UTC): usage until now was "
                f"rated under the terms in force; a change takes effect from the current hour on"
            )
        super().__init__(f"{field}: {moment:%Y-%m-%d %H:%M} UTC {why}")
