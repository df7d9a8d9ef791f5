"""The price side: what tenants pay. Price books are versioned and dated per
tier; each prices models per million tokens (optionally graduated by the
month's volume) and per GPU-second, and sets the reservation and dedicated
fees. A plan adds a monthly commitment and a discount; a subscription ties
a tenant to a plan; credit grants are prepaid money with an expiry.

History reproduces (invariant 9): whatever path saves them (the services
in billing.pricing.catalog and .plans, the admin, a shell), a version in
force and its prices, a plan a started subscription uses and a started
subscription are never changed, except an end moved from now on (a new
version or a move supersedes them). Bulk updates bypass these guards."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from billing.choices import TokenKind
from billing.errors import PlanInUseError, PriceVersionInForceError, SubscriptionStartedError
from core.fields import CurrencyField, SupportedDateTimeField
from serving.models import ServedModel
from tenants.choices import Tier
from tenants.models import Tenant


def _hour_now():
    return timezone.now().replace(minute=0, second=0, microsecond=0)


def _ends_from_now_on(old_end, new_end) -> bool:
    """Whether moving an end from `old_end` to `new_end` leaves the past as
    it was: the old end not yet reached, the new one from the current hour."""
    hour = _hour_now()
    return (old_end is None or old_end > hour) and (new_end is None or new_end >= hour)


PRICE = {"max_digits": 24, "decimal_places": 9, "validators": [MinValueValidator(0)]}
AMOUNT = {"max_digits": 20, "decimal_places": 4, "validators": [MinValueValidator(0)]}


class PriceBook(models.Model):
    """One version of a named price book, in force over [effective_from,
    effective_to) for one tier (or every tier when blank). A new version is
    a new row; a version in force is never edited."""

    name = models.CharField(max_length=100)
    version = models.PositiveIntegerField(default=1)
    tier = models.CharField(max_length=16, choices=Tier.choices, blank=True, default="")
    currency = CurrencyField(default="USD")
    effective_from = SupportedDateTimeField()
    effective_to = SupportedDateTimeField(null=True, blank=True)
    reservation_per_gpu_hour = models.DecimalField(**PRICE, default=0)
    dedicated_per_gpu_month = models.DecimalField(**PRICE, default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["name", "version"], name="pricebook_version"),
            models.CheckConstraint(
                condition=Q(effective_to__isnull=True) | Q(effective_to__gt=F("effective_from")),
                name="pricebook_period",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version} ({self.tier or 'all tiers'})"

    def save(self, *args, **kwargs):
        # The one guard every path passes (services, the admin, a shell): a
        # version in force changes only its end, from now on.
        stored = _stored(self, kwargs)
        if stored is not None and stored.in_force_or_past():
            changed = {
                f.attname
                for f in self._meta.concrete_fields
                if getattr(stored, f.attname) != getattr(self, f.attname)
            } - {"effective_to"}
            if changed or not _ends_from_now_on(stored.effective_to, self.effective_to):
                raise PriceVersionInForceError(stored)
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        if self.pk is not None and self.in_force_or_past():
            raise PriceVersionInForceError(self)
        return super().delete(*args, **kwargs)

    def in_force_or_past(self, now=None) -> bool:
        """Whether it has taken effect: then it prices history, and only its
        end may still move (from now on, when a new version supersedes it)."""
        return self.effective_from <= (now or timezone.now())


class ModelPrice(models.Model):
    """A model's prices in a book: per million input, cached-input and
    output tokens, and optionally per GPU-second of attributed device time."""

    book = models.ForeignKey(PriceBook, on_delete=models.CASCADE, related_name="prices")
    served_model = models.ForeignKey(ServedModel, on_delete=models.PROTECT, related_name="+")
    input_per_mtok = models.DecimalField(**PRICE)
    cached_input_per_mtok = models.DecimalField(**PRICE)
    output_per_mtok = models.DecimalField(**PRICE)
    per_gpu_second = models.DecimalField(**PRICE, null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["book", "served_model"], name="modelprice_unique")
        ]

    def __str__(self) -> str:
        return f"{self.book}: {self.served_model}"

    def save(self, *args, **kwargs):
        # A new model's price in a book already in force is left to the
        # services (and seeds); changing one that priced history is not.
        stored = _stored(self, kwargs)
        if stored is not None:
            _book_not_in_force(stored.book_id, self.book_id)
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        _book_not_in_force(self.book_id)
        return super().delete(*args, **kwargs)

    def per_mtok(self, kind: str):
        return getattr(self, f"{kind}_per_mtok")


class VolumeTier(models.Model):
    """Graduated pricing of one token kind: the month's tokens from
    `from_tokens` up to the next tier's start cost `per_mtok`. When a kind
    has tiers they replace the model's flat price for it; the first tier
    starts at 0."""

    model_price = models.ForeignKey(ModelPrice, on_delete=models.CASCADE, related_name="tiers")
    kind = models.CharField(max_length=16, choices=TokenKind.choices)
    from_tokens = models.BigIntegerField(validators=[MinValueValidator(0)])
    per_mtok = models.DecimalField(**PRICE)

    class Meta:
        ordering = ["kind", "from_tokens"]
        constraints = [
            models.UniqueConstraint(
                fields=["model_price", "kind", "from_tokens"], name="volumetier_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} from {self.from_tokens:,}: {self.per_mtok}/M"

    def save(self, *args, **kwargs):
        stored = _stored(self, kwargs)
        if stored is not None:
            _book_not_in_force(
                *ModelPrice.objects.filter(
                    pk__in=[stored.model_price_id, self.model_price_id]
                ).values_list("book_id", flat=True)
            )
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        _book_not_in_force(
            *ModelPrice.objects.filter(pk=self.model_price_id).values_list("book_id", flat=True)
        )
        return super().delete(*args, **kwargs)


class Plan(models.Model):
    """Commercial terms: a monthly minimum commitment (a true-up line tops
    the month up to it) and a discount on usage. A prepaid plan's usage is
    drawn from the tenant's credit: the gateway serves it only while the
    wallet's balance, less usage not yet invoiced and requests in flight,
    covers a request's worst case."""

    name = models.CharField(max_length=100, unique=True)
    currency = CurrencyField(default="USD")
    minimum_commit = models.DecimalField(**AMOUNT, default=0)
    discount_percent = models.DecimalField(
        max_digits=5,
        decimal_places=2,
        default=0,
        validators=[MinValueValidator(0), MaxValueValidator(100)],
    )
    prepaid = models.BooleanField(
        default=False,
        help_text="Usage is paid from credit grants; the gateway refuses requests "
        "(402 insufficient_credit) when the balance runs out.",
    )

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs):
        stored = _stored(self, kwargs)
        if stored is not None and stored.started_subscriptions().exists():
            raise PlanInUseError(stored)
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        if self.pk is not None and self.started_subscriptions().exists():
            raise PlanInUseError(self)
        return super().delete(*args, **kwargs)

    def started_subscriptions(self):
        """Its subscriptions already started: what its terms have priced."""
        return self.subscriptions.filter(start__lte=timezone.now())


class Subscription(models.Model):
    """A tenant on a plan from `start` (until `end`), billed monthly from
    its anchor day."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="subscriptions")
    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, related_name="subscriptions")
    issuer = models.ForeignKey(
        "billing.Issuer",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="subscriptions",
        help_text="Empty: the default issuer.",
    )
    anchor_day = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(28)]
    )
    start = SupportedDateTimeField()
    end = SupportedDateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tenant", "-start"]
        constraints = [
            models.CheckConstraint(
                condition=Q(anchor_day__gte=1, anchor_day__lte=28), name="subscription_anchor"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant} on {self.plan}"

    def save(self, *args, **kwargs):
        # Started: only its end moves, from now on (a move to another plan).
        stored = _stored(self, kwargs)
        if stored is not None and stored.start <= timezone.now():
            changed = {
                f.attname
                for f in self._meta.concrete_fields
                if getattr(stored, f.attname) != getattr(self, f.attname)
            } - {"end"}
            if changed or not _ends_from_now_on(stored.end, self.end):
                raise SubscriptionStartedError(stored)
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        if self.pk is not None and self.start <= timezone.now():
            raise SubscriptionStartedError(self)
        return super().delete(*args, **kwargs)


class CreditGrant(models.Model):
    """Prepaid money in a tenant's wallet; applied to invoices soonest
    expiry first, then by priority."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="credit_grants")
    amount = models.DecimalField(**AMOUNT)
    currency = CurrencyField(default="USD")
    granted_at = SupportedDateTimeField()
    expires_at = SupportedDateTimeField(null=True, blank=True)
    priority = models.PositiveSmallIntegerField(default=0)
    note = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        ordering = ["tenant", "expires_at", "priority"]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="creditgrant_amount_positive")
        ]

    def __str__(self) -> str:
        return f"{self.tenant}: {self.amount} {self.currency}"


def _stored(row: models.Model, save_kwargs: dict):
    """The row as stored, when a save would update it (None: an insert)."""
    if row.pk is None or save_kwargs.get("force_insert"):
        return None
    return type(row).objects.filter(pk=row.pk).first()


def _book_not_in_force(*book_ids) -> None:
    """Raise PriceVersionInForceError when any of the books has taken effect."""
    book = (
        PriceBook.objects.filter(pk__in=[b for b in book_ids if b is not None])
        .filter(effective_from__lte=timezone.now())
        .first()
    )
    if book is not None:
        raise PriceVersionInForceError(book)
