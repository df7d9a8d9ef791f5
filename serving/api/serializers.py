"""Fleet inventory for finance staff. ModelSerializers (reads and writes have
the same shape here), with every database constraint checked first so bad
input is a 400 naming the field, never a database error."""

from rest_framework import serializers

from serving.choices import PoolKind
from serving.models import Gpu, GpuSku, LoraAdapter, Node, Pool, Replica, Reservation, ServedModel


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
        fields = ["id", "name", "kind", "owner", "idle_cost_policy"]

    def validate(self, attrs):
        kind = attrs.get("kind", getattr(self.instance, "kind", None))
        owner = attrs.get("owner", getattr(self.instance, "owner", None))
        if kind == PoolKind.SHARED and owner is not None:
            raise serializers.ValidationError({"owner": "a shared pool has no owner"})
        if kind != PoolKind.SHARED and owner is None:
            raise serializers.ValidationError({"owner": f"a {kind} pool needs an owner tenant"})
        return attrs


class ServedModelSerializer(serializers.ModelSerializer):
    class Meta:
        model = ServedModel
        fields = ["id", "name", "description", "chars_per_token", "max_context_tokens"]


class LoraAdapterSerializer(serializers.ModelSerializer):
    class Meta:
        model = LoraAdapter
        fields = ["id", "name", "tenant", "base_model", "upstream_name"]


class ReplicaSerializer(serializers.ModelSerializer):
    class Meta:
        model = Replica
        fields = [
            "id",
            "name",
            "base_url",
            "model",
            "pool",
            "gpus",
            "status",
            "max_inflight",
            "last_seen_at",
            "last_error",
        ]
        read_only_fields = ["last_seen_at", "last_error"]


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
