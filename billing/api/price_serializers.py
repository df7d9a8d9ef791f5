"""Shapes of the prices API (finance staff only): price book versions with
their model prices and graduated tiers, plans, subscriptions and a
tenant's policy. Amounts are read by the one parser (core.api_decimal);
the services check the rest (billing.pricing.catalog, .plans,
tenants.policies), so a bad input is a 400 naming its field either way."""

from __future__ import annotations

from rest_framework import serializers

from billing.models import ModelPrice, Plan, PriceBook, Subscription, VolumeTier
from billing.pricing.catalog_selectors import BOOK_STATUSES
from core.api_decimal import PlainDecimalField
from core.api_query import QueryIn
from core.api_time import SupportedDateTimeField
from serving.models import ServedModel
from tenants.models import TenantPolicy
from tenants.policies import POLICY_FIELDS

DATE_OR_TIME = ["iso-8601", "%Y-%m-%d"]
PRICE = {"max_digits": 24, "decimal_places": 9, "min_value": 0}
FROM = (
    "When it takes effect (UTC, on a whole hour; a day is its 00:00): from the current hour "
    "on, never inside an invoiced (closed) period (409)."
)


class VolumeTierIn(serializers.Serializer):
    kind = serializers.CharField(help_text="input | cached_input | output")
    from_tokens = serializers.IntegerField(min_value=0, max_value=2**62)
    per_mtok = PlainDecimalField(**PRICE)


class ModelPriceIn(serializers.Serializer):
    served_model = serializers.SlugRelatedField(
        slug_field="name", queryset=ServedModel.objects.all(), help_text="The model's name."
    )
    input_per_mtok = PlainDecimalField(**PRICE)
    cached_input_per_mtok = PlainDecimalField(**PRICE)
    output_per_mtok = PlainDecimalField(**PRICE)
    per_gpu_second = PlainDecimalField(**PRICE, required=False, allow_null=True, default=None)
    tiers = VolumeTierIn(
        many=True,
        required=False,
        default=list,
        help_text="Graduated prices of a kind by the month's volume; each kind's first at 0.",
    )


class PriceBookVersionIn(serializers.Serializer):
    name = serializers.CharField(
        max_length=100, help_text="A new name starts at v1; an existing one gets its next version."
    )
    tier = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        help_text="shared | reserved | dedicated; empty: every tier. A name keeps its tier.",
    )
    currency = serializers.CharField(
        max_length=3, default="USD", help_text="ISO 4217. A name keeps its currency."
    )
    effective_from = SupportedDateTimeField(input_formats=DATE_OR_TIME, help_text=FROM)
    reservation_per_gpu_hour = PlainDecimalField(**PRICE, default=0)
    dedicated_per_gpu_month = PlainDecimalField(**PRICE, default=0)
    prices = ModelPriceIn(many=True, help_text="Every model the version prices.")


class PriceBookVersionUpdateIn(serializers.Serializer):
    effective_from = SupportedDateTimeField(
        input_formats=DATE_OR_TIME, required=False, help_text=FROM
    )
    reservation_per_gpu_hour = PlainDecimalField(**PRICE, required=False)
    dedicated_per_gpu_month = PlainDecimalField(**PRICE, required=False)
    prices = ModelPriceIn(many=True, required=False, help_text="Replaces every model price.")


class VolumeTierOut(serializers.ModelSerializer):
    class Meta:
        model = VolumeTier
        fields = ["kind", "from_tokens", "per_mtok"]


class ModelPriceOut(serializers.ModelSerializer):
    served_model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    tiers = VolumeTierOut(many=True, read_only=True)

    class Meta:
        model = ModelPrice
        fields = [
            "served_model",
            "input_per_mtok",
            "cached_input_per_mtok",
            "output_per_mtok",
            "per_gpu_second",
            "tiers",
        ]


class PriceBookOut(serializers.ModelSerializer):
    status = serializers.CharField(help_text=" | ".join(BOOK_STATUSES))

    class Meta:
        model = PriceBook
        fields = [
            "id",
            "name",
            "version",
            "tier",
            "currency",
            "effective_from",
            "effective_to",
            "status",
            "reservation_per_gpu_hour",
            "dedicated_per_gpu_month",
            "created_at",
        ]


class PriceBookDetailOut(PriceBookOut):
    prices = ModelPriceOut(many=True, read_only=True)

    class Meta(PriceBookOut.Meta):
        fields = [*PriceBookOut.Meta.fields, "prices"]


class PriceBookQueryIn(QueryIn):
    name = serializers.CharField(required=False, help_text="One book's versions.")


class PlanIn(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    currency = serializers.CharField(max_length=3, default="USD")
    minimum_commit = PlainDecimalField(
        max_digits=20,
        decimal_places=4,
        min_value=0,
        default=0,
        help_text="Per month, in the plan's currency, to its minor units (JPY: whole yen).",
    )
    discount_percent = PlainDecimalField(
        max_digits=5, decimal_places=2, min_value=0, max_value=100, default=0
    )
    prepaid = serializers.BooleanField(default=False)


class PlanUpdateIn(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False)
    currency = serializers.CharField(max_length=3, required=False)
    minimum_commit = PlainDecimalField(max_digits=20, decimal_places=4, min_value=0, required=False)
    discount_percent = PlainDecimalField(
        max_digits=5, decimal_places=2, min_value=0, max_value=100, required=False
    )
    prepaid = serializers.BooleanField(required=False)


class PlanOut(serializers.ModelSerializer):
    started = serializers.IntegerField(
        help_text="Subscriptions already started (any: its terms never change)."
    )
    subscribed = serializers.IntegerField(help_text="Subscriptions in force or scheduled.")

    class Meta:
        model = Plan
        fields = [
            "id",
            "name",
            "currency",
            "minimum_commit",
            "discount_percent",
            "prepaid",
            "started",
            "subscribed",
        ]


class SubscriptionMoveIn(serializers.Serializer):
    plan = serializers.PrimaryKeyRelatedField(
        queryset=Plan.objects.all(), help_text="The plan's id."
    )
    effective_from = SupportedDateTimeField(input_formats=DATE_OR_TIME, help_text=FROM)
    anchor_day = serializers.IntegerField(
        min_value=1,
        max_value=28,
        required=False,
        help_text="A first subscription's billing day (default 1); a move keeps the tenant's.",
    )


class SubscriptionOut(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    plan = serializers.SlugRelatedField(slug_field="name", read_only=True)
    plan_id = serializers.IntegerField()

    class Meta:
        model = Subscription
        fields = ["id", "tenant", "plan", "plan_id", "anchor_day", "start", "end"]


class PolicyIn(serializers.ModelSerializer):
    """Any of a policy's fields; the others stay. Checked as the admin's
    form checks them (tenants.policies)."""

    monthly_budget = PlainDecimalField(
        max_digits=20,
        decimal_places=4,
        min_value=0,
        required=False,
        allow_null=True,
        help_text="In the tenant's billing currency, to its minor units; null: no budget.",
    )

    class Meta:
        model = TenantPolicy
        fields = list(POLICY_FIELDS)
        extra_kwargs = {f: {"required": False} for f in POLICY_FIELDS}
