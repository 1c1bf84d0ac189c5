"""The push app: its node hooks (the in-process delivery sweeper) are wired here."""

from django.apps import AppConfig


class PushConfig(AppConfig):
    name = "push"
    verbose_name = "Push notifications"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core import lifecycle as node
        from push import metrics, worker

        metrics.register()
        node.on_startup(worker.start)
        node.on_shutdown(worker.stop)
