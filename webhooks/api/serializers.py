"""Input and output shapes of the webhooks API."""

from rest_framework import serializers

from webhooks.choices import DeliveryStatus, EventType
from webhooks.models import Delivery, DeliveryAttempt, Endpoint


class EndpointIn(serializers.Serializer):
    url = serializers.CharField(max_length=500)
    event_types = serializers.ListField(child=serializers.CharField(max_length=40), min_length=1)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)


class EndpointPatchIn(serializers.Serializer):
    url = serializers.CharField(max_length=500, required=False)
    event_types = serializers.ListField(
        child=serializers.CharField(max_length=40), min_length=1, required=False
    )
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    active = serializers.BooleanField(required=False)


class EndpointOut(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = Endpoint
        fields = ["id", "tenant", "url", "description", "event_types", "active", "created_at"]


class EndpointCreatedOut(EndpointOut):
    class Meta(EndpointOut.Meta):
        fields = [*EndpointOut.Meta.fields, "secret"]


class AttemptOut(serializers.ModelSerializer):
    class Meta:
        model = DeliveryAttempt
        fields = ["at", "status_code", "latency_ms", "error", "body_sha256", "by"]


class DeliveryOut(serializers.ModelSerializer):
    event_id = serializers.CharField()
    event_type = serializers.CharField(source="event.type")
    summary = serializers.CharField(source="event.summary")
    endpoint = serializers.IntegerField(source="endpoint_id")

    class Meta:
        model = Delivery
        fields = [
            "id", "event_id", "event_type", "summary", "endpoint", "status", "attempts",
            "next_attempt_at", "delivered_at", "created_at",
        ]  # fmt: skip


class DeliveryDetailOut(DeliveryOut):
    log = AttemptOut(many=True)

    class Meta(DeliveryOut.Meta):
        fields = [*DeliveryOut.Meta.fields, "log"]


class DeliveryListIn(serializers.Serializer):
    endpoint = serializers.IntegerField(required=False, min_value=1)
    status = serializers.ChoiceField(choices=DeliveryStatus.choices, required=False)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=500, default=100)


class AlertsIn(serializers.Serializer):
    emailed = serializers.ListField(child=serializers.ChoiceField(choices=EventType.choices))


class AlertsOut(serializers.Serializer):
    emailed = serializers.ListField(child=serializers.CharField())
