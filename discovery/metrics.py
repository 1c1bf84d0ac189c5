"""Prometheus metrics of discovery, on the default registry (the gateway serves /metrics)."""

from prometheus_client import Counter, Gauge, Histogram

CARD_FETCHES = Counter(
    "a2a_discovery_card_fetches_total",
    "Agent card fetches by result: 200 (bytes received), 304 (not modified), error.",
    ["result"],
)
CARD_FETCH_200 = CARD_FETCHES.labels(result="200")
CARD_FETCH_304 = CARD_FETCHES.labels(result="304")
CARD_FETCH_ERRORS = CARD_FETCHES.labels(result="error")
CARD_PARSES = Counter(
    "a2a_discovery_card_parses_total", "Agent cards parsed (only when their bytes changed)."
)
ALERTS = Counter("a2a_discovery_alerts_total", "Discovery alerts raised, by kind.", ["kind"])
SNAPSHOT_VERSION = Gauge("a2a_discovery_snapshot_version",
                         "Version of the default tenant's current snapshot.")
SNAPSHOT_AGENTS = Gauge("a2a_discovery_snapshot_agents",
                        "Agents in the default tenant's current snapshot.")
TENANT_SNAPSHOT_VERSION = Gauge("a2a_discovery_tenant_snapshot_version",
                                "Version of each tenant's current snapshot.", ["tenant"])
TENANT_SNAPSHOT_AGENTS = Gauge("a2a_discovery_tenant_snapshot_agents",
                               "Agents in each tenant's current snapshot.", ["tenant"])
SNAPSHOTS_PUBLISHED = Counter("a2a_discovery_snapshots_published_total", "Snapshots published.")
DEGRADED_ENDPOINTS = Gauge("a2a_discovery_degraded_endpoints", "Endpoints currently degraded.")
PINNED_SESSIONS = Gauge("a2a_discovery_pinned_sessions", "Sessions pinned to a snapshot.")
CYCLE_SECONDS = Histogram(
    "a2a_discovery_cycle_seconds", "Duration of one discovery cycle.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
