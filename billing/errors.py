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
