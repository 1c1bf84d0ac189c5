from rest_framework.routers import SimpleRouter

from registry.api.views import AgentViewSet

router = SimpleRouter()
router.trailing_slash = "/?"  # /agents and /agents/ are the same resource
router.register("agents", AgentViewSet, basename="agent")

urlpatterns = router.urls
