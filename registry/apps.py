from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every process (serve, celery, manage) sets tracing up once, per A2A_TRACING.
        from core import tracing

        tracing.setup()
        # A wrong A2A_JWT_ISSUERS entry fails the process at start, naming it.
        from registry import identity

        identity.check_configuration()
