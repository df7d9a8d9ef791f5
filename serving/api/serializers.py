"""Fleet inventory for finance staff. ModelSerializers (reads and writes have
the same shape here), with every database constraint checked first so bad
input is a 400 naming the field, never a database error."""

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.utils import timezone
from rest_framework import serializers

from core.errors import InputError
from serving.choices import GpuSharing, PoolKind
from serving.gpu_shares import Share
from serving.models import (
    Gpu,
    GpuSku,
    GridIntensity,
    LoraAdapter,
    Node,
    Pool,
    Replica,
    ReplicaGpu,
    Reservation,
    ServedModel,
    grid_intensity_check,
    role_misfit,
)
from serving.services import replica_gpu_shares_set, share_of


class GpuSkuSerializer(serializers.ModelSerializer):
    class Meta:
        model = GpuSku
        fields = [
            "id",
            "name",
            "memory_gb",
            "list_price",
            "currency",
            "power_idle_watts",
            "power_busy_watts",
            "mig_capable",
        ]

    def validate(self, attrs):
        idle = attrs.get("power_idle_watts", getattr(self.instance, "power_idle_watts", 0))
        busy = attrs.get("power_busy_watts", getattr(self.instance, "power_busy_watts", 0))
        if busy < idle:
            raise serializers.ValidationError(
                {"power_busy_watts": "must be at least power_idle_watts"}
            )
        return attrs


class NodeSerializer(serializers.ModelSerializer):
    class Meta:
        model = Node
        fields = ["id", "name", "site"]


class GpuSerializer(serializers.ModelSerializer):
    class Meta:
        model = Gpu
        fields = [
            "id",
            "serial",
            "sku",
            "node",
            "in_service_date",
            "capex",
            "useful_life_months",
            "salvage_value",
            "lease_rate_per_hour",
            "currency",
        ]

    def validate(self, attrs):
        def value(name):
            return attrs.get(name, getattr(self.instance, name, None))

        capex, life, lease = (
            value("capex"),
            value("useful_life_months"),
            value("lease_rate_per_hour"),
        )
        if lease is not None and capex is not None:
            raise serializers.ValidationError(
                {"lease_rate_per_hour": "a GPU is either owned (capex) or leased, not both"}
            )
        if lease is None and capex is None:
            raise serializers.ValidationError(
                {"capex": "give capex and useful_life_months, or lease_rate_per_hour"}
            )
        if capex is not None and not life:
            raise serializers.ValidationError(
                {"useful_life_months": "required (and above zero) for an owned GPU"}
            )
        salvage = value("salvage_value") or 0
        if capex is not None and salvage > capex:
            raise serializers.ValidationError({"salvage_value": "must not exceed capex"})
        return attrs


class PoolSerializer(serializers.ModelSerializer):
    class Meta:
        model = Pool
        fields = ["id", "name", "kind", "owner", "idle_cost_policy", "disaggregated"]

    def validate(self, attrs):
        kind = attrs.get("kind", getattr(self.instance, "kind", None))
        owner = attrs.get("owner", getattr(self.instance, "owner", None))
        if kind == PoolKind.SHARED and owner is not None:
            raise serializers.ValidationError({"owner": "a shared pool has no owner"})
        if kind != PoolKind.SHARED and owner is None:
            raise serializers.ValidationError({"owner": f"a {kind} pool needs an owner tenant"})
        if self.instance is not None and "disaggregated" in attrs:
            changed = Pool(name=self.instance.name, disaggregated=attrs["disaggregated"])
            for role in self.instance.replicas.values_list("role", flat=True).distinct():
                problem = role_misfit(changed, role)
                if problem:
                    raise serializers.ValidationError({"disaggregated": problem})
        return attrs


class ServedModelSerializer(serializers.ModelSerializer):
    class Meta:
        model = ServedModel
        fields = ["id", "name", "description", "task", "chars_per_token", "max_context_tokens"]


class LoraAdapterSerializer(serializers.ModelSerializer):
    class Meta:
        model = LoraAdapter
        fields = ["id", "name", "tenant", "base_model", "upstream_name"]


class GpuShareSerializer(serializers.ModelSerializer):
    """One GPU a replica holds: whole, a MIG instance (its profile and GPU
    instance id) or a time-sliced share (a percentage); `units` of 700 to
    a GPU, worked out by the server."""

    gpu = serializers.PrimaryKeyRelatedField(queryset=Gpu.objects.all())
    sharing = serializers.ChoiceField(choices=GpuSharing.choices, default=GpuSharing.WHOLE)

    class Meta:
        model = ReplicaGpu
        fields = ["gpu", "sharing", "mig_profile", "mig_instance", "share_percent", "units"]
        read_only_fields = ["units"]
        # serving.services checks a share against its GPU's others (naming the
        # field), before the database's own constraints could.
        validators = []
        extra_kwargs = {
            "mig_profile": {"required": False},
            "mig_instance": {"required": False},
            "share_percent": {"required": False},
        }


class ReplicaSerializer(serializers.ModelSerializer):
    """`gpus` (ids of GPUs held whole) or `gpu_shares` on write, not both;
    both on read."""

    gpus = serializers.PrimaryKeyRelatedField(many=True, queryset=Gpu.objects.all(), required=False)
    gpu_shares = GpuShareSerializer(many=True, required=False)

    class Meta:
        model = Replica
        fields = [
            "id",
            "name",
            "base_url",
            "engine",
            "role",
            "model",
            "pool",
            "gpus",
            "gpu_shares",
            "status",
            "status_since",
            "max_inflight",
            "concurrency",
            "concurrency_limit",
            "concurrency_limit_at",
            "last_seen_at",
            "last_error",
        ]
        read_only_fields = [
            "status_since",
            "last_seen_at",
            "last_error",
            "concurrency_limit",
            "concurrency_limit_at",
        ]

    def validate(self, attrs):
        if "gpus" in attrs and "gpu_shares" in attrs:
            raise serializers.ValidationError(
                {"gpu_shares": "send gpus (whole GPUs) or gpu_shares, not both"}
            )
        pool = attrs.get("pool", getattr(self.instance, "pool", None))
        problem = role_misfit(pool, attrs.get("role", getattr(self.instance, "role", "both")))
        if problem:
            raise serializers.ValidationError({"role": problem})
        return attrs

    @staticmethod
    def _shares(attrs) -> list[Share] | None:
        if "gpu_shares" in attrs:
            return [Share.asked(s["gpu"].pk, s) for s in attrs.pop("gpu_shares")]
        if "gpus" in attrs:
            return [Share(gpu_id=gpu.pk) for gpu in attrs.pop("gpus")]
        return None

    @transaction.atomic
    def create(self, validated_data):
        field = "gpu_shares" if "gpu_shares" in validated_data else None
        shares = self._shares(validated_data)
        replica = Replica.objects.create(**validated_data, status_since=timezone.now())
        _shares_set(replica, shares or [], field)
        return replica

    @transaction.atomic
    def update(self, instance, validated_data):
        field = "gpu_shares" if "gpu_shares" in validated_data else None
        shares = self._shares(validated_data)
        if validated_data.get("status", instance.status) != instance.status:
            validated_data["status_since"] = timezone.now()
        replica = super().update(instance, validated_data)
        if shares is not None or "pool" in validated_data:
            # A pool change re-checks the shares (time-sliced ones share a pool).
            current = shares if shares is not None else _held(replica)
            _shares_set(replica, current, field)
        return replica


def _shares_set(replica: Replica, shares: list[Share], field: str | None) -> None:
    """Refusals name the share's field within `field` (gpu_shares.mig_profile)."""
    try:
        replica_gpu_shares_set(replica=replica, shares=shares)
    except InputError as bad:
        if field and bad.field != "gpus":
            raise InputError(f"{field}.{bad.field}", bad.message) from None
        raise


def _held(replica: Replica) -> list[Share]:
    return [share_of(row) for row in replica.gpu_shares.select_related("replica")]


class ReservationSerializer(serializers.ModelSerializer):
    class Meta:
        model = Reservation
        fields = ["id", "tenant", "pool", "gpu_count", "start", "end"]

    def validate(self, attrs):
        start = attrs.get("start", getattr(self.instance, "start", None))
        end = attrs.get("end", getattr(self.instance, "end", None))
        if start and end and end <= start:
            raise serializers.ValidationError({"end": "must be after start"})
        pool = attrs.get("pool", getattr(self.instance, "pool", None))
        if pool is not None and pool.kind != PoolKind.RESERVED:
            raise serializers.ValidationError({"pool": "reservations are made in reserved pools"})
        if attrs.get("gpu_count", 1) < 1:
            raise serializers.ValidationError({"gpu_count": "must be at least 1"})
        return attrs


class GridIntensitySerializer(serializers.ModelSerializer):
    class Meta:
        model = GridIntensity
        fields = ["id", "site", "period", "start", "g_per_kwh", "source"]

    def validate(self, attrs):
        period = attrs.get("period", getattr(self.instance, "period", None))
        start = attrs.get("start", getattr(self.instance, "start", None))
        try:
            grid_intensity_check(period=period, start=start)
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.message_dict) from None
        return attrs
