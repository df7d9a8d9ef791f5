"""Errors billing's services raise; the API maps them to HTTP statuses."""


class InvoiceStateError(Exception):
    """The invoice is not in a state that allows this (409)."""

    code = "invoice_state"


class BillingInputError(Exception):
    """Bad input to a billing service, naming the field (400)."""

    code = "invalid"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
