from django.apps import AppConfig


class ArdConfig(AppConfig):
    name = "ard"
    verbose_name = "Agentic Resource Discovery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from ard import indexer, metrics, ranking, selectors
        from registry import events
        from registry import selectors as registry_selectors

        # The search index follows the registry through its one event hook (no signals).
        events.subscribe(indexer.on_registry_event, many=indexer.on_registry_events)
        # And ranks the registry's own text search (API ?q=, the admin's search box).
        registry_selectors.set_text_search(selectors.registry_agents_ranked)
        # And cards not registered (yet): discovery's needs described in words.
        registry_selectors.set_card_ranking(ranking.rank_cards)
        # Its writer's gauges, served by the node's GET /metrics with the gateway's.
        metrics.register()
