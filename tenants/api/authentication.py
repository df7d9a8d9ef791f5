"""DRF authentication by key: `Authorization: Bearer glk_...` (a tenant's API
key) or `Bearer gls_...` (a platform service key)."""

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication

from tenants.access import ApiKeyUser, ServiceKeyUser
from tenants.errors import AuthenticationError, TenantSuspendedError
from tenants.keys import SERVICE_KEY_PREFIX
from tenants.services import api_key_authenticate, service_key_authenticate


class ApiKeyAuthentication(BaseAuthentication):
    """No Authorization header: not ours, session auth may still apply.
    A header that is not `Bearer <key>`, or a bad key: 401. A suspended
    tenant's key: 403."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION")
        if header is None:
            return None
        parts = header.split()
        if len(parts) != 2 or parts[0].lower() != self.keyword.lower():
            raise exceptions.AuthenticationFailed(
                "Authorization header must be 'Bearer <API key>'", code="malformed_authorization"
            )
        if parts[1].startswith(SERVICE_KEY_PREFIX):
            try:
                service_key = service_key_authenticate(raw_key=parts[1])
            except AuthenticationError as exc:
                raise exceptions.AuthenticationFailed(str(exc), code=exc.code) from None
            return ServiceKeyUser(service_key), service_key
        try:
            key = api_key_authenticate(raw_key=parts[1])
        except AuthenticationError as exc:
            raise exceptions.AuthenticationFailed(str(exc), code=exc.code) from None
        except TenantSuspendedError as exc:
            raise exceptions.PermissionDenied(str(exc), code=exc.code) from None
        return ApiKeyUser(key), key

    def authenticate_header(self, request):
        return f'{self.keyword} realm="api"'
