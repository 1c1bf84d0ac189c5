from django.apps import AppConfig


class DiscoveryConfig(AppConfig):
    name = "discovery"

    def ready(self) -> None:
        # Card signature checks fetch trusted JWKS URLs through discovery's HTTP client.
        from discovery.jwks import jwks_fetch
        from registry.signatures import set_jwks_fetcher

        set_jwks_fetcher(jwks_fetch)
