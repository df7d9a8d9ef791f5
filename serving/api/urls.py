from rest_framework.routers import SimpleRouter

from serving.api import views

router = SimpleRouter(trailing_slash=False)
router.register("fleet/gpu-skus", views.GpuSkuViewSet, basename="gpu-sku")
router.register("fleet/nodes", views.NodeViewSet, basename="node")
router.register("fleet/gpus", views.GpuViewSet, basename="gpu")
router.register("fleet/pools", views.PoolViewSet, basename="pool")
router.register("fleet/models", views.ServedModelViewSet, basename="served-model")
router.register("fleet/lora-adapters", views.LoraAdapterViewSet, basename="lora-adapter")
router.register("fleet/replicas", views.ReplicaViewSet, basename="replica")
router.register("fleet/reservations", views.ReservationViewSet, basename="reservation")
router.register("fleet/grid-intensities", views.GridIntensityViewSet, basename="grid-intensity")

urlpatterns = router.urls
