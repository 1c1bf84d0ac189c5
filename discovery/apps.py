from django.apps import AppConfig


class DiscoveryConfig(AppConfig):
    name = "discovery"
