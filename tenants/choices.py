"""Enumerations used by tenants' models, services and the API."""

from django.db import models


class Tier(models.TextChoices):
    SHARED = "shared", "Shared"
    RESERVED = "reserved", "Reserved"
    DEDICATED = "dedicated", "Dedicated"


class TenantStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    SUSPENDED = "suspended", "Suspended"


class Role(models.TextChoices):
    """A tenant member's role. Platform finance staff are not a role here:
    they hold the `tenants.finance_staff` permission (the Finance group)."""

    OWNER = "owner", "Owner"
    ADMIN = "admin", "Admin"
    VIEWER = "viewer", "Viewer"


KEY_MANAGER_ROLES = frozenset({Role.OWNER, Role.ADMIN})


class Scope(models.TextChoices):
    """What an API key may do."""

    INFERENCE = "inference", "Inference (the OpenAI-compatible gateway)"
    USAGE_READ = "usage:read", "Read usage"
    BILLING_READ = "billing:read", "Read invoices and spend"
    AUDIT_READ = "audit:read", "Read the audit trail (granted by owners only)"


class ServiceScope(models.TextChoices):
    """What a platform service key (not a tenant's) may do."""

    USAGE_WRITE = "usage:write", "Report usage events (another serving tier)"


# What a signed-in member may read through the API, by role. Only an owner
# reads the tenant's audit trail, and only an owner grants a key that may.
ROLE_SCOPES = {
    Role.OWNER: frozenset({Scope.USAGE_READ, Scope.BILLING_READ, Scope.AUDIT_READ}),
    Role.ADMIN: frozenset({Scope.USAGE_READ, Scope.BILLING_READ}),
    Role.VIEWER: frozenset({Scope.USAGE_READ, Scope.BILLING_READ}),
}


class PriorityClass(models.TextChoices):
    """A tenant's scheduling class; vLLM schedules lower numbers first."""

    CRITICAL = "critical", "Critical"
    HIGH = "high", "High"
    NORMAL = "normal", "Normal"
    BATCH = "batch", "Batch"


VLLM_PRIORITY = {
    PriorityClass.CRITICAL: 0,
    PriorityClass.HIGH: 10,
    PriorityClass.NORMAL: 50,
    PriorityClass.BATCH: 100,
}

FINANCE_GROUP = "Finance"
FINANCE_PERMISSION = "tenants.finance_staff"
