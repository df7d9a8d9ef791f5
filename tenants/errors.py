"""Errors the tenants services raise; the API maps them to HTTP statuses."""

from core.errors import ConflictError


class AuthenticationError(Exception):
    """The credential is missing, malformed, unknown, revoked or expired (401)."""

    code = "authentication_failed"


class TenantSuspendedError(Exception):
    """The credential is valid but its tenant is suspended (403)."""

    code = "tenant_suspended"


class LastOwnerError(ConflictError):
    """A tenant must keep at least one owner (409)."""

    code = "last_owner"
