"""Tenants, their members, API keys and serving policies."""

from decimal import Decimal

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Length
from django.utils import timezone

from core.fields import CurrencyField, SupportedDateTimeField
from tenants.choices import PriorityClass, Role, Scope, ServiceScope, TenantStatus, Tier
from tenants.keys import KEY_PREFIX, SERVICE_KEY_PREFIX

models.CharField.register_lookup(Length)

# Bounds on a tenant's gateway queue: waiting is for seconds, not hours, and
# memory stays bounded under a flood.
QUEUE_TIMEOUT_MS_MAX = 600_000
MAX_QUEUED_REQUESTS_MAX = 10_000


class Tenant(models.Model):
    """A customer of the platform: everything it sends through the gateway is
    metered, costed and billed to it, in its billing currency."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=63, unique=True)
    tier = models.CharField(max_length=16, choices=Tier.choices, default=Tier.SHARED)
    billing_currency = CurrencyField(default="USD", help_text="ISO 4217 code")
    status = models.CharField(
        max_length=16, choices=TenantStatus.choices, default=TenantStatus.ACTIVE
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        permissions = [("finance_staff", "Platform finance staff: sees every tenant")]
        constraints = [
            models.CheckConstraint(
                condition=Q(billing_currency__regex=r"^[A-Z]{3}$"),
                name="tenant_currency_iso4217",
            ),
            models.CheckConstraint(condition=Q(tier__in=Tier.values), name="tenant_tier_valid"),
            models.CheckConstraint(
                condition=Q(status__in=TenantStatus.values), name="tenant_status_valid"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs) -> None:
        """A move to another tier, by any path (admin, API, command), is
        kept as a TierChange from now: the hours before it stay priced under
        the tier they were served in (invariant 9)."""
        fields = kwargs.get("update_fields")
        before = None
        if self.pk is not None and (fields is None or "tier" in fields):
            before = Tenant.objects.filter(pk=self.pk).values_list("tier", flat=True).first()
        super().save(*args, **kwargs)
        if before is not None and before != self.tier:
            TierChange.objects.create(
                tenant=self, from_tier=before, tier=self.tier, effective_from=timezone.now()
            )

    @property
    def is_active(self) -> bool:
        return self.status == TenantStatus.ACTIVE


class TierChange(models.Model):
    """A tenant's move between tiers: `tier` from `effective_from` on,
    `from_tier` before it. Rating prices each hour under the tier in force
    then (billing.pricing.rating); a tenant with none was always in its
    `tier`."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="tier_changes")
    from_tier = models.CharField(max_length=16, choices=Tier.choices)
    tier = models.CharField(max_length=16, choices=Tier.choices)
    effective_from = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant", "effective_from", "pk"]
        indexes = [models.Index(fields=["tenant", "effective_from"])]

    def __str__(self) -> str:
        since = f"{self.effective_from:%Y-%m-%d %H:%M}"
        return f"{self.tenant}: {self.from_tier} to {self.tier} from {since}"


class Membership(models.Model):
    """A user's role inside one tenant."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant__name", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique"),
            models.CheckConstraint(condition=Q(role__in=Role.values), name="membership_role_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant} ({self.role})"


class HashedKey(models.Model):
    """What every credential has: a public prefix that finds the row and
    tells keys apart on screen, and only an HMAC of the secret (shown once,
    at creation)."""

    KIND = ""  # the key's leading characters, e.g. "glk_"

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.display_prefix} ({self.name})"

    @property
    def display_prefix(self) -> str:
        return f"{self.KIND}{self.prefix}…"


class ApiKey(HashedKey):
    """A tenant's credential, with scopes and an optional expiry."""

    KIND = KEY_PREFIX

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    scopes = ArrayField(models.CharField(max_length=32, choices=Scope.choices))
    expires_at = SupportedDateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta(HashedKey.Meta):
        indexes = [models.Index(fields=["tenant", "-created_at"], name="apikey_tenant_created")]
        constraints = [
            models.CheckConstraint(condition=Q(name__length__gt=0), name="apikey_name_not_empty"),
            models.CheckConstraint(condition=Q(scopes__len__gt=0), name="apikey_has_scope"),
            models.CheckConstraint(
                condition=Q(scopes__contained_by=Scope.values), name="apikey_scopes_known"
            ),
        ]


class ServiceKey(HashedKey):
    """A platform credential for machines, not tenants: another serving tier
    reporting usage for many tenants."""

    KIND = SERVICE_KEY_PREFIX

    scopes = ArrayField(models.CharField(max_length=32, choices=ServiceScope.choices))

    class Meta(HashedKey.Meta):
        constraints = [
            models.CheckConstraint(
                condition=Q(name__length__gt=0), name="servicekey_name_not_empty"
            ),
            models.CheckConstraint(
                condition=Q(scopes__len__gt=0) & Q(scopes__contained_by=ServiceScope.values),
                name="servicekey_scopes_known",
            ),
        ]


class TenantPolicy(models.Model):
    """How the gateway treats a tenant: its scheduling class, admission limits,
    share and queue at the gateway, and monthly budget. Empty limits mean
    unlimited."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="policy")
    priority_class = models.CharField(
        max_length=16, choices=PriorityClass.choices, default=PriorityClass.NORMAL
    )
    max_concurrent_requests = models.PositiveIntegerField(null=True, blank=True)
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True)
    max_inflight_tokens = models.PositiveIntegerField(
        null=True, blank=True, help_text="Prompt + max_tokens of all requests in flight."
    )
    monthly_budget = models.DecimalField(
        max_digits=20,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal(0))],
        help_text="In the tenant's billing currency; empty means no budget.",
    )
    budget_soft_percent = models.PositiveSmallIntegerField(
        default=80, help_text="Notify when spend crosses this share of the budget."
    )
    budget_hard_percent = models.PositiveSmallIntegerField(
        default=100, help_text="Refuse new requests when spend crosses this share."
    )
    # Fair queuing at the gateway (gateway/fairness.py).
    fair_share_weight = models.PositiveSmallIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(1000)],
        help_text="Share of a contended replica against other tenants of the same "
        "priority class: a weight of 2 gets twice the token service of a weight of 1.",
    )
    queue_timeout_ms = models.PositiveIntegerField(
        default=5000,
        validators=[MaxValueValidator(QUEUE_TIMEOUT_MS_MAX)],
        help_text="How long a request may wait at the gateway (for a replica slot or "
        "under the concurrency and in-flight token limits) before a 429; 0 never waits.",
    )
    max_queued_requests = models.PositiveIntegerField(
        default=100,
        validators=[MaxValueValidator(MAX_QUEUED_REQUESTS_MAX)],
        help_text="Requests that may wait at the gateway at once; more are refused (429).",
    )
    # Set by billing's budget check when spend crosses the hard threshold;
    # the gateway refuses the tenant's requests (402) while it is set.
    budget_blocked_at = models.DateTimeField(null=True, blank=True, editable=False)
    budget_block_message = models.CharField(max_length=300, blank=True, default="", editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "tenant policies"
        constraints = [
            models.CheckConstraint(
                condition=Q(priority_class__in=PriorityClass.values), name="policy_priority_valid"
            ),
            models.CheckConstraint(
                condition=Q(monthly_budget__isnull=True) | Q(monthly_budget__gte=0),
                name="policy_budget_not_negative",
            ),
            models.CheckConstraint(
                condition=Q(budget_soft_percent__gt=0)
                & Q(budget_soft_percent__lte=models.F("budget_hard_percent")),
                name="policy_soft_le_hard",
            ),
            models.CheckConstraint(
                condition=Q(fair_share_weight__gt=0), name="policy_fair_share_weight_positive"
            ),
            models.CheckConstraint(
                condition=Q(queue_timeout_ms__lte=QUEUE_TIMEOUT_MS_MAX),
                name="policy_queue_timeout_bounded",
            ),
            models.CheckConstraint(
                condition=Q(max_queued_requests__lte=MAX_QUEUED_REQUESTS_MAX),
                name="policy_max_queued_bounded",
            ),
        ]

    def __str__(self) -> str:
        return f"policy for {self.tenant}"
