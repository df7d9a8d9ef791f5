"""The fleet inventory API: platform finance staff only."""

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import viewsets

from serving.api import serializers
from serving.models import (
    Gpu,
    GpuSku,
    GridIntensity,
    LoraAdapter,
    Node,
    Pool,
    Replica,
    Reservation,
    ServedModel,
)
from tenants.api.permissions import IsFinanceStaff


def fleet_viewset(model, serializer_class, *, related=()):
    """A finance-only list/create/retrieve/update viewset for a fleet model."""

    @extend_schema_view(
        list=extend_schema(tags=["fleet"], responses={200: serializer_class(many=True)}),
        retrieve=extend_schema(tags=["fleet"]),
        create=extend_schema(tags=["fleet"]),
        update=extend_schema(tags=["fleet"]),
        partial_update=extend_schema(tags=["fleet"]),
    )
    class FleetViewSet(viewsets.ModelViewSet):
        permission_classes = [IsFinanceStaff]
        http_method_names = ["get", "post", "put", "patch", "head", "options"]

        def get_queryset(self):
            queryset = model.objects.all()
            return queryset.select_related(*related) if related else queryset

        def get_serializer_class(self):
            return serializer_class

    FleetViewSet.__name__ = f"{model.__name__}ViewSet"
    FleetViewSet.__qualname__ = FleetViewSet.__name__
    return FleetViewSet


GpuSkuViewSet = fleet_viewset(GpuSku, serializers.GpuSkuSerializer)
NodeViewSet = fleet_viewset(Node, serializers.NodeSerializer)
GpuViewSet = fleet_viewset(Gpu, serializers.GpuSerializer, related=("sku", "node"))
PoolViewSet = fleet_viewset(Pool, serializers.PoolSerializer)
ServedModelViewSet = fleet_viewset(ServedModel, serializers.ServedModelSerializer)
LoraAdapterViewSet = fleet_viewset(LoraAdapter, serializers.LoraAdapterSerializer)
ReplicaViewSet = fleet_viewset(Replica, serializers.ReplicaSerializer)
ReservationViewSet = fleet_viewset(Reservation, serializers.ReservationSerializer)
GridIntensityViewSet = fleet_viewset(GridIntensity, serializers.GridIntensitySerializer)
