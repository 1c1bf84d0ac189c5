"""The one settings module. Every value comes from the environment through core.env.

With no environment at all the platform runs *embedded*: a SQLite file in ``data/``, the
in-memory channel layer, Celery tasks run in-process. ``DATABASE_URL`` selects PostgreSQL and
``REDIS_URL`` selects Redis for the channel layer, the Celery broker and locks (*distributed*).
"""

from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path

from config import checks
from core.env import (
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_str,
    refuse_unknown_names,
)

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("A2A_DATA_DIR", str(BASE_DIR / "data")))

DATABASE_URL = env_str("DATABASE_URL")
REDIS_URL = env_str("REDIS_URL")
EMBEDDED = not REDIS_URL

# PostgreSQL without Redis is a mode of its own, chosen explicitly: one node on PostgreSQL with
# the in-memory channel layer and in-process jobs (config.checks.check_mode).
A2A_SINGLE_NODE = env_bool("A2A_SINGLE_NODE", False)
DEBUG = env_bool("DEBUG", False)
checks.check_mode(database_url=DATABASE_URL, redis_url=REDIS_URL, single_node=A2A_SINGLE_NODE,
                  debug=DEBUG)

# Embedded/dev without SECRET_KEY: a key generated once and kept in the data folder.
SECRET_KEY = checks.secret_key(env_str("SECRET_KEY"), embedded=EMBEDDED, data_dir=DATA_DIR)
# Host names this node answers to (never "*" by default outside DEBUG).
ALLOWED_HOSTS = checks.allowed_hosts(env_list("ALLOWED_HOSTS"), debug=DEBUG, embedded=EMBEDDED)
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")
# Proxies whose X-Forwarded-Proto / X-Forwarded-Host are believed (IPs). Empty: none.
A2A_TRUSTED_PROXIES = env_list("A2A_TRUSTED_PROXIES")

INSTALLED_APPS = [
    # First: its management commands win over daphne's and Django's (node's runserver refuses
    # and points to serve).
    "node",
    "daphne",
    # The admin with the operator dashboard as its index (console.site.ConsoleAdminSite).
    "console.apps.ConsoleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework_api_key",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "channels",
    "registry",
    "push",
    "gateway",
    "discovery",
    "ard",
    "console",
    "mcp_bridge.apps.McpBridgeConfig",
]

MIDDLEWARE = [
    # Outermost: database outages answer a JSON 503 at once (core.outage).
    "core.outage.DatabaseOutageMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
# Registry bodies carry one card (64 KiB cap); anything far larger is refused with 413.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("A2A_MAX_API_BODY_BYTES", 1024 * 1024, minimum=1024)
ASGI_APPLICATION = "config.asgi.application"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# Short waits on an unreachable database, so every surface answers (a 503) within 2 s and the
# node notices the database is back within about a second (core.outage). libpq counts the
# connect timeout in whole seconds, 2 at least.
A2A_DB_CONNECT_TIMEOUT_SECONDS = env_int("A2A_DB_CONNECT_TIMEOUT_SECONDS", 2, minimum=2)
A2A_DB_POOL_TIMEOUT_SECONDS = env_float("A2A_DB_POOL_TIMEOUT_SECONDS", 1.5, minimum=0.1)
if DATABASE_URL:
    DATABASES = checks.url_databases(DATABASE_URL, connect_timeout=A2A_DB_CONNECT_TIMEOUT_SECONDS)
    if checks.is_postgresql(DATABASES["default"]) and env_bool("A2A_DB_POOL", True):
        checks.add_pool(DATABASES["default"], max_size=env_int("A2A_DB_POOL_MAX", 20, minimum=1),
                        timeout=A2A_DB_POOL_TIMEOUT_SECONDS,
                        connect_timeout=A2A_DB_CONNECT_TIMEOUT_SECONDS)
else:
    DATABASES = checks.sqlite_databases(
        env_str("A2A_SQLITE_PATH", str(DATA_DIR / "registry.sqlite3")), data_dir=DATA_DIR
    )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
# The admin's and API docs' assets, served by whitenoise straight from the installed apps, so
# a node needs no collectstatic step and no separate web server.
WHITENOISE_USE_FINDERS = True
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns on every start without it
WHITENOISE_AUTOREFRESH = DEBUG
# One-time tokens shown after creating an API client stay server-side, not in a cookie.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

# --- caches and channel layer ------------------------------------------------------------
if REDIS_URL:
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
    }
    # direct (the gateway's own layer), pubsub or core (channels-redis's): config.checks.
    CHANNEL_LAYERS = checks.redis_channel_layers(
        REDIS_URL, env_choice("A2A_CHANNEL_LAYER", "direct", ("direct", "pubsub", "core"))
    )
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "gateway.layers.InMemoryChannelLayer",
            "CONFIG": {"capacity": 10000},
        }
    }

# --- push notifications relayed by the gateway (push/, docs/push.md) -------------------------
# Relay mode: callers' webhooks kept by the gateway, agents given a gateway URL. On by default
# in distributed mode; an agent's push_relay (API, admin) overrides it.
A2A_PUSH_RELAY = env_bool("A2A_PUSH_RELAY", not EMBEDDED)
# The base URL agents reach this node's /push/ at ("": A2A_PUBLIC_BASE_URL, else the caller's).
A2A_PUSH_RELAY_BASE_URL = (env_str("A2A_PUSH_RELAY_BASE_URL") or "").rstrip("/")
A2A_PUSH_MAX_BYTES = env_int("A2A_PUSH_MAX_BYTES", 256 * 1024, minimum=1024)
A2A_PUSH_RATE_PER_SECOND = env_float("A2A_PUSH_RATE_PER_SECOND", 50.0, minimum=0.01)
A2A_PUSH_RATE_BURST = env_int("A2A_PUSH_RATE_BURST", 100, minimum=1)
A2A_PUSH_MAX_ATTEMPTS = env_int("A2A_PUSH_MAX_ATTEMPTS", 8, minimum=1)
A2A_PUSH_BACKOFF_SECONDS = env_float("A2A_PUSH_BACKOFF_SECONDS", 2.0, minimum=0.001)
A2A_PUSH_BACKOFF_MAX_SECONDS = env_float("A2A_PUSH_BACKOFF_MAX_SECONDS", 600.0, minimum=0.001)
A2A_PUSH_TIMEOUT_SECONDS = env_float("A2A_PUSH_TIMEOUT_SECONDS", 10.0, minimum=0.05)
# How long past an attempt's deadline its claim lasts (the database write after it included):
# a deliverer that died mid-attempt has its push tried again after deadline + this.
A2A_PUSH_CLAIM_MARGIN_SECONDS = env_float("A2A_PUSH_CLAIM_MARGIN_SECONDS", 30.0, minimum=1.0)
A2A_PUSH_MAX_RESPONSE_BYTES = env_int("A2A_PUSH_MAX_RESPONSE_BYTES", 64 * 1024, minimum=0)
# celery: workers deliver (distributed default); inprocess: the serving node's own threads.
A2A_PUSH_DELIVERY = env_choice("A2A_PUSH_DELIVERY", "inprocess" if EMBEDDED else "celery",
                               ("celery", "inprocess"))
A2A_PUSH_DELIVERY_THREADS = env_int("A2A_PUSH_DELIVERY_THREADS", 4, minimum=1)
A2A_PUSH_SWEEP_SECONDS = env_float("A2A_PUSH_SWEEP_SECONDS", 2.0, minimum=0.01)
A2A_PUSH_RETENTION_SECONDS = env_float("A2A_PUSH_RETENTION_SECONDS", 86400.0, minimum=1)
# Relayed configs with nothing open or dead: purged this long after their last push (or their
# creation), and A2A_PUSH_RETENTION_SECONDS after their task was seen done.
A2A_PUSH_CONFIG_RETENTION_SECONDS = env_float("A2A_PUSH_CONFIG_RETENTION_SECONDS", 604800.0,
                                              minimum=1)
# PEM private keys (EC P-256 or Ed25519), comma-separated: the first signs, all are published
# at /.well-known/jwks.json. Empty: an Ed25519 key derived from SECRET_KEY.
A2A_PUSH_SIGNING_KEY_FILES = env_list("A2A_PUSH_SIGNING_KEY_FILES")

# --- Celery ----------------------------------------------------------------------------------
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = EMBEDDED
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Survives database and broker outages (node/beat.py).
CELERY_BEAT_SCHEDULER = "node.beat:ResilientDatabaseScheduler"
CELERY_TIMEZONE = TIME_ZONE
A2A_EXPIRY_INTERVAL_SECONDS = env_float("A2A_EXPIRY_INTERVAL_SECONDS", 5.0, minimum=0.1)
DISCOVERY_INTERVAL_SECONDS = env_float("DISCOVERY_INTERVAL_SECONDS", 60.0, minimum=1)
# How often the search index's repair job indexes agents whose document is missing or stale (a
# node that died with documents deferred, ARD_INDEX_DEFERRED).
ARD_INDEX_REPAIR_SECONDS = env_float("ARD_INDEX_REPAIR_SECONDS", 300.0, minimum=1)
# Beat entries every serving node runs itself in distributed mode, under a cluster-wide lock
# (node.periodic): expiry and node-death recovery need no single beat process. Empty: beat only.
A2A_NODE_PERIODIC_TASKS = env_list("A2A_NODE_PERIODIC_TASKS",
                                   ["registry-expire-agents", "ard-index-repair", "push-sweep"])
# Every entry expires within its interval so a backlog never piles up.
CELERY_BEAT_SCHEDULE = {
    "registry-expire-agents": {
        "task": "registry.tasks.agents_expire_task",
        "schedule": timedelta(seconds=A2A_EXPIRY_INTERVAL_SECONDS),
        "options": {"expires": A2A_EXPIRY_INTERVAL_SECONDS},
    },
    # Cheap and quiet when discovery is not configured (two EXISTS queries).
    "discovery-cycle": {
        "task": "discovery.tasks.discovery_cycle_task",
        "schedule": timedelta(seconds=DISCOVERY_INTERVAL_SECONDS),
        "options": {"expires": DISCOVERY_INTERVAL_SECONDS},
    },
    "ard-index-repair": {
        "task": "ard.tasks.index_repair_task",
        "schedule": timedelta(seconds=ARD_INDEX_REPAIR_SECONDS),
        "options": {"expires": ARD_INDEX_REPAIR_SECONDS},
    },
    # Celery delivery: enqueues the due pushes (retries, lost messages); inprocess: a no-op
    # (the node's own sweeper, push.worker, does it).
    "push-sweep": {
        "task": "push.tasks.sweep_task",
        "schedule": timedelta(seconds=A2A_PUSH_SWEEP_SECONDS),
        "options": {"expires": A2A_PUSH_SWEEP_SECONDS},
    },
}

# --- REST framework ----------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "registry.auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["registry.auth.IsAuthenticatedOrAnonymousAllowed"],
    "DEFAULT_PAGINATION_CLASS": "registry.api.pagination.CappedLimitOffsetPagination",
    "PAGE_SIZE": 100,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "registry.api.exceptions.exception_handler",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "A2A Agent Registry",
    "DESCRIPTION": "Registry, gateway and discovery for A2A agents.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI and ReDoc served from the installed drf-spectacular-sidecar: no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"persistAuthorization": True},
    # The /a2a gateway is raw ASGI (not a Django view): its paths are added to the document.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "console.schema.add_gateway_paths",
        "node.schema.document_errors",  # the error answers of every operation
    ],
}

# --- the platform ------------------------------------------------------------------------------
# `manage.py serve` without NODE_ID serves as host:port of its --port (core.lifecycle.node_id).
NODE_ID = env_str("NODE_ID") or f"{socket.gethostname()}:{env_str('A2A_PORT', '8000')}"
A2A_PUBLIC_BASE_URL = (env_str("A2A_PUBLIC_BASE_URL") or "").rstrip("/")
A2A_ALLOW_ANONYMOUS = env_bool("A2A_ALLOW_ANONYMOUS", False)
A2A_ERROR_PROFILE = env_choice("A2A_ERROR_PROFILE", "a2a", ("a2a", "kubemq"))
A2A_CALLER_ID_HEADER = env_str("A2A_CALLER_ID_HEADER", "X-KubeMQ-Caller-ID")
A2A_DEFAULT_TTL_SECONDS = env_int("A2A_DEFAULT_TTL_SECONDS", 90, minimum=1)
A2A_MAX_TTL_SECONDS = env_int("A2A_MAX_TTL_SECONDS", 86400, minimum=1)
A2A_EXPIRED_RETENTION_SECONDS = env_int("A2A_EXPIRED_RETENTION_SECONDS", 3600, minimum=0)
A2A_AGENT_MAX_CONCURRENCY = env_int("A2A_AGENT_MAX_CONCURRENCY", 100, minimum=1)
A2A_DEFAULT_TIMEOUT_SECONDS = env_float("A2A_DEFAULT_TIMEOUT_SECONDS", 300)
A2A_MAX_TIMEOUT_SECONDS = env_float("A2A_MAX_TIMEOUT_SECONDS", 3600)
A2A_GATEWAY_TIMEOUT_BUFFER_SECONDS = env_float("A2A_GATEWAY_TIMEOUT_BUFFER_SECONDS", 10)
A2A_MAX_REQUEST_BYTES = env_int("A2A_MAX_REQUEST_BYTES", 10 * 1024 * 1024, minimum=1)
A2A_MAX_RESPONSE_BYTES = env_int("A2A_MAX_RESPONSE_BYTES", 10 * 1024 * 1024, minimum=1)
A2A_SSE_KEEPALIVE_SECONDS = env_float("A2A_SSE_KEEPALIVE_SECONDS", 30, minimum=0.05)
A2A_SSE_IDLE_TIMEOUT_SECONDS = env_float("A2A_SSE_IDLE_TIMEOUT_SECONDS", 300, minimum=0.1)
# Backpressure of relayed streams: at most this many bytes wait for a caller per stream (then
# the agent is no longer read); a caller that reads nothing for the stall timeout while data
# waits gets a terminal error event and the stream is freed.
A2A_SSE_BUFFER_BYTES = env_int("A2A_SSE_BUFFER_BYTES", 1024 * 1024, minimum=4096)
A2A_SSE_STALL_TIMEOUT_SECONDS = env_float("A2A_SSE_STALL_TIMEOUT_SECONDS", 60, minimum=0.05)
# Resumable streams (docs/streams.md): how long the owning node keeps a stream whose caller left,
# for a reconnect with Last-Event-ID (0: off, the agent's stream is cancelled at once), and the
# bytes of numbered events it keeps per stream (when full while nobody reads, the agent waits).
A2A_SSE_RESUME_SECONDS = env_float("A2A_SSE_RESUME_SECONDS", 0, minimum=0)
A2A_SSE_RESUME_BUFFER_BYTES = env_int("A2A_SSE_RESUME_BUFFER_BYTES", 4 * 1024 * 1024, minimum=4096)
# Distributed mode (docs/streams.md "Across nodes"): the bytes of large replies' pieces Redis may
# hold for this node (as the entry node) across all its calls at once; owners wait for a grant
# beyond it. At least one piece (64 KiB); the default stays below Redis's pubsub soft limit.
A2A_BROKER_INFLIGHT_BYTES = env_int("A2A_BROKER_INFLIGHT_BYTES", 8 * 1024 * 1024,
                                    minimum=64 * 1024)
# Extra agent response header names never relayed to callers (comma-separated; a trailing "*"
# matches a prefix), on top of gateway.headers.DROPPED_RESPONSE_HEADERS.
A2A_DROP_RESPONSE_HEADERS = env_list("A2A_DROP_RESPONSE_HEADERS")
A2A_AGENT_URL_ALLOWLIST = env_list("A2A_AGENT_URL_ALLOWLIST")
# How long the registration URL check waits for a host name's lookup; a name that has not
# resolved by then is accepted as "does not resolve now" (checked again at every connection).
A2A_URL_CHECK_DNS_TIMEOUT_SECONDS = env_float("A2A_URL_CHECK_DNS_TIMEOUT_SECONDS", 2.0,
                                              minimum=0.01)
# PEM bundle of extra CAs trusted for https agents (besides the system store). Empty: none.
A2A_OUTBOUND_CA_FILE = env_str("A2A_OUTBOUND_CA_FILE", "")
# --- the outbound HTTP layer (outbound/): every client towards agents, card servers, registries
# Proxy URL for the library clients (card fetches, discovery); HTTP(S)_PROXY are not read.
A2A_OUTBOUND_PROXY = env_str("A2A_OUTBOUND_PROXY", "")
# The gateway's hot-path client: "own" (hand-written HTTP/1.1, fastest) or "aiohttp".
A2A_OUTBOUND_CLIENT = env_choice("A2A_OUTBOUND_CLIENT", "own", ("own", "aiohttp"))
A2A_OUTBOUND_CONNECT_TIMEOUT_SECONDS = env_float(
    "A2A_OUTBOUND_CONNECT_TIMEOUT_SECONDS", 10.0, minimum=0.01
)
# Bounds on an agent's response headers (and trailers): count and bytes before the body.
A2A_OUTBOUND_MAX_HEADERS = env_int("A2A_OUTBOUND_MAX_HEADERS", 100, minimum=1)
A2A_OUTBOUND_MAX_HEADER_BYTES = env_int("A2A_OUTBOUND_MAX_HEADER_BYTES", 65536, minimum=1024)
A2A_MAX_CARD_BYTES = env_int("A2A_MAX_CARD_BYTES", 64 * 1024, minimum=1)
A2A_CARD_VALIDATION = env_choice("A2A_CARD_VALIDATION", "lenient", ("lenient", "strict"))
A2A_CARD_FETCH_TIMEOUT_SECONDS = env_float("A2A_CARD_FETCH_TIMEOUT_SECONDS", 5)
A2A_CARDS_REQUIRE_TOKEN = env_bool("A2A_CARDS_REQUIRE_TOKEN", False)
# Card signatures (docs/signatures.md): off | verify (record the result) | require (refuse
# unsigned/invalid cards at registration and in discovery). Trusted keys come only from here.
A2A_CARD_SIGNATURES = env_choice("A2A_CARD_SIGNATURES", "verify", ("off", "verify", "require"))
A2A_CARD_JWKS_FILE = env_str("A2A_CARD_JWKS_FILE", "")
A2A_CARD_JWKS_URLS = env_list("A2A_CARD_JWKS_URLS")
A2A_CARD_JWKS_MIN_REFRESH_SECONDS = env_float("A2A_CARD_JWKS_MIN_REFRESH_SECONDS", 30.0)
# OpenTelemetry tracing (docs/tracing.md): off | on. The exporter follows the standard OTEL_*
# variables (OTLP over HTTP by default); setting those alone does not turn tracing on.
A2A_TRACING = env_choice("A2A_TRACING", "off", ("off", "on"))
# The standard OpenTelemetry variables this project reads itself (the OTLP exporter reads the
# OTEL_EXPORTER_OTLP_* and OTEL_BSP_* ones directly): the SDK's off switch (spec: "true"
# disables, anything else does not), the exporter kind, the service name of the resource.
OTEL_SDK_DISABLED = (env_str("OTEL_SDK_DISABLED", "") or "").strip().lower() == "true"
OTEL_TRACES_EXPORTER = (env_str("OTEL_TRACES_EXPORTER", "") or "otlp").strip().lower()
OTEL_SERVICE_NAME = env_str("OTEL_SERVICE_NAME", "") or "a2a-registry"
A2A_RATE_LIMIT_PER_SECOND = env_float("A2A_RATE_LIMIT_PER_SECOND", 0)  # 0: off
A2A_RATE_LIMIT_BURST = env_int("A2A_RATE_LIMIT_BURST", 0)
# Tenant rate quotas (docs/tenants.md "Quotas"): the window of max_registrations_per_minute
# (60: a minute; tests shorten it), and how often a gateway node re-reads the tenants' call and
# stream quotas in the background (a change in the admin applies within it).
A2A_TENANT_REGISTRATION_WINDOW_SECONDS = env_float(
    "A2A_TENANT_REGISTRATION_WINDOW_SECONDS", 60.0, minimum=0.1)
A2A_TENANT_QUOTAS_REFRESH_SECONDS = env_float("A2A_TENANT_QUOTAS_REFRESH_SECONDS", 5.0,
                                              minimum=0.1)
A2A_AUTH_CACHE_SECONDS = env_float("A2A_AUTH_CACHE_SECONDS", 10)
# Verified tokens keep working this long after their last successful check while the database
# cannot be reached (revocations are honoured again as soon as it answers).
A2A_AUTH_STALE_SECONDS = env_float("A2A_AUTH_STALE_SECONDS", 300)
A2A_AUTH_LOOKUP_TIMEOUT_SECONDS = env_float("A2A_AUTH_LOOKUP_TIMEOUT_SECONDS", 1.0, minimum=0.05)
A2A_AUTH_LOOKUP_THREADS = env_int("A2A_AUTH_LOOKUP_THREADS", 4, minimum=1)
# External identity (docs/identity.md): JWTs from trusted issuers, a JSON list (off when empty),
# each entry checked here so a wrong one stops the process at start, named.
A2A_JWT_ISSUERS = checks.jwt_issuers(env_str("A2A_JWT_ISSUERS", "") or "")
A2A_JWT_MAX_BYTES = env_int("A2A_JWT_MAX_BYTES", 8192, minimum=256)
A2A_JWT_LEEWAY_SECONDS = env_float("A2A_JWT_LEEWAY_SECONDS", 60)
A2A_JWT_JWKS_TTL_SECONDS = env_float("A2A_JWT_JWKS_TTL_SECONDS", 600, minimum=1)
A2A_JWT_JWKS_MIN_REFRESH_SECONDS = env_float("A2A_JWT_JWKS_MIN_REFRESH_SECONDS", 30)
A2A_JWT_FETCH_TIMEOUT_SECONDS = env_float("A2A_JWT_FETCH_TIMEOUT_SECONDS", 5, minimum=0.1)
A2A_ROUTING_RESYNC_SECONDS = env_float("A2A_ROUTING_RESYNC_SECONDS", 30, minimum=0.1)
# The incremental resync reads rows changed since its previous read began minus this overlap
# (clock skew between nodes, transactions that commit late); a full reload every
# A2A_ROUTING_FULL_RESYNC_SECONDS covers anything older (purged rows, pruned tombstones).
A2A_ROUTING_FULL_RESYNC_SECONDS = env_float("A2A_ROUTING_FULL_RESYNC_SECONDS", 600, minimum=1)
A2A_ROUTING_RESYNC_OVERLAP_SECONDS = env_float("A2A_ROUTING_RESYNC_OVERLAP_SECONDS", 60,
                                               minimum=0)
A2A_NODE_HEARTBEAT_SECONDS = env_float("A2A_NODE_HEARTBEAT_SECONDS", 10, minimum=1)
# Fast node-death detection (distributed mode, gateway/liveness.py): every node refreshes a
# Redis key of its own this often, with this TTL; a peer whose key is gone is dead at once
# (its in-flight calls end, its agents are adopted). The database heartbeat above stays for the
# admin and for the expiry job.
A2A_NODE_LIVENESS_REFRESH_SECONDS = env_float("A2A_NODE_LIVENESS_REFRESH_SECONDS", 1.0,
                                              minimum=0.05)
A2A_NODE_LIVENESS_TTL_SECONDS = env_float("A2A_NODE_LIVENESS_TTL_SECONDS", 3.0, minimum=0.2)
# What happens to a node's agents when it dies or stops: "adopt" (a live node takes them over
# without re-registration; a node stopping cleanly hands them over first) or "expire" (KubeMQ's
# seed behaviour: they expire with the node and re-register on a live one).
A2A_FAILOVER = env_choice("A2A_FAILOVER", "adopt", ("adopt", "expire"))
# A node stopping cleanly waits at most this long for its handed-over subscribers to drain
# (in-flight calls finish on the old owner); what still runs then is cancelled.
A2A_HANDOVER_TIMEOUT_SECONDS = env_float("A2A_HANDOVER_TIMEOUT_SECONDS", 30, minimum=0.1)
# A node stopping (SIGTERM/SIGINT) stops accepting connections, then lets the requests it is
# answering finish for up to this long; those still running are answered `node_stopping`.
A2A_SHUTDOWN_DRAIN_SECONDS = env_float("A2A_SHUTDOWN_DRAIN_SECONDS", 25, minimum=0)
# Hand a Query straight to the subscriber when it lives in the receiving process (no broker
# hop). Off: every request goes through the channel layer (same behaviour, slower).
A2A_LOCAL_FAST_PATH = env_bool("A2A_LOCAL_FAST_PATH", True)
# Move everything loaded at node start out of the cyclic GC's reach (gc.freeze): a full
# collection of a Django process costs ~60 ms of stalled requests. Off for test processes,
# which start and stop many nodes.
A2A_GC_FREEZE = env_bool("A2A_GC_FREEZE", True)
# With A2A_GC_FREEZE: the young generation's threshold (gc.set_threshold's first value; Python's
# default is 700). Every request allocates coroutines, tasks, dicts and lists that live until
# it ends, so at 700 the cyclic GC ran a young collection every few requests over the objects
# of every request in flight; a larger threshold runs it that much less often (cyclic garbage
# waits for at most this many allocations). 0: Python's default.
A2A_GC_GEN0_THRESHOLD = env_int("A2A_GC_GEN0_THRESHOLD", 10_000)
# --- the gRPC binding (gateway/grpc_binding/; docs/gateway.md "The gRPC binding") ---
# The node's gRPC listener: its TCP port (0: any free one), off when unset or empty; `manage.py
# serve --grpc-port` overrides it. It listens on serve's --host (127.0.0.1 otherwise).
A2A_GRPC_PORT: int | None = checks.grpc_port(
    (env_str("A2A_GRPC_PORT", "") or "").strip(), env_int("A2A_GRPC_PORT", 0)
)
# HTTP/2 streams (calls) one connection may have open at once; more wait for a free one.
A2A_GRPC_MAX_CONCURRENT_STREAMS = env_int("A2A_GRPC_MAX_CONCURRENT_STREAMS", 100, minimum=1)
# host:port written into served cards for the gRPC interface; empty: the card's gateway host
# (A2A_PUBLIC_BASE_URL's, or the request's) with the listener's port.
A2A_GRPC_PUBLIC_ADDRESS = (env_str("A2A_GRPC_PUBLIC_ADDRESS", "") or "").strip()
# --- the node's edge (node/servers.py, node/edge.py) ---
# Both servers: an incomplete request head is cut after this long, an idle kept-alive
# connection after A2A_HTTP_KEEPALIVE_SECONDS; connections beyond the limit get 503 at once.
A2A_HTTP_HEADER_TIMEOUT_SECONDS = env_float("A2A_HTTP_HEADER_TIMEOUT_SECONDS", 10, minimum=0.1)
A2A_HTTP_KEEPALIVE_SECONDS = env_float("A2A_HTTP_KEEPALIVE_SECONDS", 5, minimum=0.1)
A2A_HTTP_MAX_CONNECTIONS = env_int("A2A_HTTP_MAX_CONNECTIONS", 4096, minimum=1)
# GET /metrics: open only in embedded mode unless a token is required; it then takes
# A2A_METRICS_TOKEN (when set) or an admin-scope API token.
A2A_METRICS_TOKEN = env_str("A2A_METRICS_TOKEN", "") or ""
A2A_METRICS_REQUIRE_TOKEN = env_bool(
    "A2A_METRICS_REQUIRE_TOKEN", bool(A2A_METRICS_TOKEN) or not EMBEDDED
)
# Quotas: agents one API client may own (0: no limit; admin clients are exempt), and the
# largest page a list endpoint answers (/api/v1/agents ?limit, KubeMQ GET /agents ?limit).
A2A_MAX_AGENTS_PER_CLIENT = env_int("A2A_MAX_AGENTS_PER_CLIENT", 1000, minimum=0)
A2A_MAX_PAGE_SIZE = env_int("A2A_MAX_PAGE_SIZE", 500, minimum=1)
DISCOVERY_CONFIG = env_str("DISCOVERY_CONFIG")
# --- operator console (console/): per-agent statistics and the audit log ---
A2A_STATS = env_bool("A2A_STATS", True)
A2A_STATS_RETENTION_HOURS = env_float("A2A_STATS_RETENTION_HOURS", 48, minimum=0.1)
A2A_STATS_FLUSH_SECONDS = env_float("A2A_STATS_FLUSH_SECONDS", 5, minimum=0.05)
A2A_AUDIT = env_choice("A2A_AUDIT", "errors", ("off", "errors", "all"))
A2A_AUDIT_RETENTION_HOURS = env_float("A2A_AUDIT_RETENTION_HOURS", 168, minimum=0.1)
A2A_AUDIT_MAX_PENDING = env_int("A2A_AUDIT_MAX_PENDING", 10000, minimum=1)
A2A_AUDIT_MAX_REFUSED_PER_MINUTE = env_int("A2A_AUDIT_MAX_REFUSED_PER_MINUTE", 60, minimum=1)
# --- discovery (discovery/) ---
DISCOVERY_FETCH_TIMEOUT_SECONDS = env_float("DISCOVERY_FETCH_TIMEOUT_SECONDS", 5.0, minimum=0.01)
DISCOVERY_CONNECT_TIMEOUT_SECONDS = env_float(
    "DISCOVERY_CONNECT_TIMEOUT_SECONDS", 3.0, minimum=0.01
)
DISCOVERY_FETCH_CONCURRENCY = env_int("DISCOVERY_FETCH_CONCURRENCY", 32, minimum=1)
DISCOVERY_HTTP_TRANSPORT = env_choice("DISCOVERY_HTTP_TRANSPORT", "aiohttp", ("aiohttp", "httpx"))
DISCOVERY_EXPIRY_JITTER = env_float("DISCOVERY_EXPIRY_JITTER", 0.1, minimum=0)
DISCOVERY_AGENT_TTL_SECONDS = env_int(
    "DISCOVERY_AGENT_TTL_SECONDS", max(300, int(DISCOVERY_INTERVAL_SECONDS * 3)), minimum=1
)
DISCOVERY_SESSION_IDLE_SECONDS = env_float("DISCOVERY_SESSION_IDLE_SECONDS", 86400, minimum=1)
DISCOVERY_ALERT_WEBHOOK_URL = env_str("DISCOVERY_ALERT_WEBHOOK_URL")
DISCOVERY_POLICY_HOOK = env_str("DISCOVERY_POLICY_HOOK")  # dotted path: hook(need, record, card)
# A need described in words (``text``) matches the cycle's cards that ARD's ranker scores at or
# above this (0-100, 100 the best card of the cycle for that text).
DISCOVERY_NEED_TEXT_MIN_SCORE = env_int("DISCOVERY_NEED_TEXT_MIN_SCORE", 50, minimum=1)
# Size cap of one ARD ai-catalog.json read by the "catalogs" discovery source.
DISCOVERY_CATALOG_MAX_BYTES = env_int("DISCOVERY_CATALOG_MAX_BYTES", 1024 * 1024, minimum=1024)

# --- Agentic Resource Discovery (ard/) ---
# The URN publisher (a domain name) of this registry's catalog entries: urn:air:<host>:<ns>:<id>.
# Blank: the host of A2A_PUBLIC_BASE_URL when it is a domain name, else the RFC 2606 placeholder
# "agent.localhost" (the ARD naming guide's choice for local sandboxes).
ARD_PUBLIC_HOST = checks.ard_public_host(
    (env_str("ARD_PUBLIC_HOST") or "").strip().lower().rstrip(".")
)
ARD_URN_NAMESPACE = env_str("ARD_URN_NAMESPACE", "a2a")
ARD_HOST_DISPLAY_NAME = env_str("ARD_HOST_DISPLAY_NAME", "A2A Agent Registry")
ARD_HOST_IDENTIFIER = env_str("ARD_HOST_IDENTIFIER", "")  # e.g. did:web:agents.example.com
ARD_HOST_DOCUMENTATION_URL = env_str("ARD_HOST_DOCUMENTATION_URL", "")
ARD_HOST_LOGO_URL = env_str("ARD_HOST_LOGO_URL", "")
ARD_CATALOG_MAX_AGE_SECONDS = env_int("ARD_CATALOG_MAX_AGE_SECONDS", 300)
# "auto" (PostgreSQL full text / SQLite FTS5 / portable), or a dotted path to a Ranker class.
ARD_RANKER = env_str("ARD_RANKER", "auto")
# Relevance cutoff: matches scoring below this (0-100) are left out of search and explore.
ARD_MIN_SCORE = env_int("ARD_MIN_SCORE", 1)
# Registrations written together leave their search documents to a writer thread of the node
# (searches on that node wait for them; other nodes see them milliseconds later). Off: each
# batch writes its documents before answering.
ARD_INDEX_DEFERRED = env_bool("ARD_INDEX_DEFERRED", True)
# Semantic search (docs/ard.md#how-ranking-works): documents embedded as they are indexed, and
# the lexical and semantic rankings fused. Off: lexical ranking alone.
ARD_SEMANTIC = env_bool("ARD_SEMANTIC", True)
ARD_EMBEDDER = env_str("ARD_EMBEDDER", "ard.embeddings.WordLlamaEmbedder")
ARD_EMBEDDING_DIM = env_int("ARD_EMBEDDING_DIM", 128, minimum=8)
ARD_FUSION_LEXICAL_WEIGHT = env_float("ARD_FUSION_LEXICAL_WEIGHT", 1.0)
ARD_FUSION_SEMANTIC_WEIGHT = env_float("ARD_FUSION_SEMANTIC_WEIGHT", 2.0)
ARD_SEMANTIC_MIN_SIMILARITY = env_float("ARD_SEMANTIC_MIN_SIMILARITY", 0.2, minimum=-1)
ARD_SEMANTIC_SYNC_SECONDS = env_float("ARD_SEMANTIC_SYNC_SECONDS", 5.0)
# PostgreSQL: documents are embedded by a thread of the node after they are written (off: with
# them, as on SQLite).
ARD_EMBED_DEFERRED = env_bool("ARD_EMBED_DEFERRED", True)

# --- MCP bridge (mcp_bridge/): every routable agent as a tool at /mcp ---
A2A_MCP_ENABLED = env_bool("A2A_MCP_ENABLED", True)
# Tool descriptions from agent cards where no reviewed (discovery) description exists; off:
# only the agent id and card name (card text is an injection surface for MCP clients' models).
A2A_MCP_CARD_DESCRIPTIONS = env_bool("A2A_MCP_CARD_DESCRIPTIONS", True)
# Notification streams (GET /mcp with a session id, subscriptions/listen) a node holds, in all
# and per client; their keepalive (also: the token re-checked, a write's longest wait).
A2A_MCP_MAX_STREAMS = env_int("A2A_MCP_MAX_STREAMS", 1000, minimum=0)
A2A_MCP_MAX_STREAMS_PER_CLIENT = env_int("A2A_MCP_MAX_STREAMS_PER_CLIENT", 20, minimum=0)
A2A_MCP_KEEPALIVE_SECONDS = env_float("A2A_MCP_KEEPALIVE_SECONDS", 15.0, minimum=0.1)
# Files sent as tool arguments (base64 or URL parts of one call): at most this many, and this
# many bytes decoded in all (the request itself stays under A2A_MAX_REQUEST_BYTES).
A2A_MCP_MAX_FILES = env_int("A2A_MCP_MAX_FILES", 10, minimum=0)
A2A_MCP_MAX_FILE_BYTES = env_int("A2A_MCP_MAX_FILE_BYTES", 4 * 1024 * 1024, minimum=0)
# /mcp?q=<text> lists the tools whose agents ARD's ranker scores at or above this (0-100, 100
# the best match of the text), best first.
A2A_MCP_QUERY_MIN_SCORE = env_int("A2A_MCP_QUERY_MIN_SCORE", 50, minimum=1)

# --- settings that must agree with one another (checked last: every name above has been read) ---
checks.check_agreement(globals())
refuse_unknown_names(("A2A_", "DISCOVERY_", "ARD_"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        "celery.app.trace": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        # The MCP SDK's stateless transport logs a line per request ("Terminating session"):
        # /mcp answers every tool call with a fresh transport (mcp_bridge/server.py).
        "mcp.server.streamable_http": {"level": "WARNING"},
    },
}
