"""The one outbound HTTP layer: every connection the platform opens towards agents, card
servers and remote registries is built here.

- :mod:`outbound.policy`: TLS (system store + ``A2A_OUTBOUND_CA_FILE``), proxy, timeouts, pool
  limits and header bounds, from settings, as one typed snapshot;
- :mod:`outbound.addresses`: which addresses may be connected to (IPv4 and IPv6 alike,
  embedded IPv4 decoded); ``registry.netcheck`` applies them at registration;
- :mod:`outbound.resolve`: the same rules at connect time, for every client (DNS rebinding);
- :mod:`outbound.errors`: transport errors that say whether the request was sent, and their
  one mapping to the gateway's error kinds and ``executed``;
- :mod:`outbound.clients`: httpx and aiohttp clients built under the policy.

The gateway's hot-path HTTP/1.1 client (``outbound.http1``) is built on the same parts.
Importable by registry, gateway and discovery: it imports none of them.
"""
