from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every process (serve, celery, manage) sets tracing up once, per A2A_TRACING.
        from core import tracing

        tracing.setup()
