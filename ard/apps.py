from django.apps import AppConfig


class ArdConfig(AppConfig):
    name = "ard"
    verbose_name = "Agentic Resource Discovery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from ard import indexer
        from registry import events

        # The search index follows the registry through its one event hook (no signals).
        events.subscribe(indexer.on_registry_event, many=indexer.on_registry_events)
