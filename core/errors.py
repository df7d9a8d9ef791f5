"""The base classes of the errors services raise. Each app's errors
subclass one of these, so the API's one error shape (core.api_errors)
maps them to HTTP statuses without importing any app."""

from __future__ import annotations


class ServiceError(Exception):
    """A service refused what it was asked; `code` is the API's error code."""

    code = "error"


class ConflictError(ServiceError):
    """The request conflicts with the current state (409)."""

    code = "conflict"


class InputError(ServiceError):
    """Bad input to a service, naming the field (400)."""

    code = "invalid"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
