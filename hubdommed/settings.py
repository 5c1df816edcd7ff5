"""Hub DomMed settings, all read from the environment.

Every value has a default that works on a developer's machine (PostgreSQL,
Redis and RabbitMQ on 127.0.0.1). A bad value stops the process at start-up
with a message naming the variable; see ``common.env``.
"""

import base64
import hashlib
import re
from datetime import timedelta
from pathlib import Path

import environ
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

from common.env import Env
from lifecycle.startup import daemon_process

BASE_DIR = Path(__file__).resolve().parent.parent
environ.Env.read_env(BASE_DIR / ".env")  # optional; the real environment wins
env = Env()

DEBUG = env.bool("DEBUG", default=True)

# A development key exists only in DEBUG; production must provide its own.
_DEV_SECRET_KEY = "insecure-development-key-do-not-use-in-production-0123456789abcdef"  # noqa: S105 (development only)
SECRET_KEY = env.str("SECRET_KEY", default=_DEV_SECRET_KEY if DEBUG else "")
if not SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
if not DEBUG and SECRET_KEY == _DEV_SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY is the development key; set a real one (DEBUG is off)")

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["*"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "hubdommed.apps.HubAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "identity",
    "sector",
    "automation",
    "job",
    "schedule",
    "outbox",
    "relay",
    "worker",
    "webhook",
]

MIDDLEWARE = [
    # Outermost: every line logged while a request is served carries its correlation id.
    "common.middleware.CorrelationIdMiddleware",
    # Counts, times and logs each request with the status the client gets.
    "common.middleware.RequestMetricsMiddleware",
    # Then, so that it sees every answer: under /api/ and /health/, errors are JSON in the
    # one format whatever DEBUG says (no debug page, which lists settings and environment).
    "common.middleware.ApiErrorMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Serves the admin's and the API docs' static files from the application server itself
    # (WhiteNoise, its table of files read once per process).
    "common.static_files.StaticFilesMiddleware",
    # Before anything reads a body: one sent without its length is refused, not read as empty.
    "common.middleware.UnsizedBodyMiddleware",
    # Before anything reads the session cookie, the query string or a form.
    "common.middleware.UnstorableTextMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "hubdommed.urls"
WSGI_APPLICATION = "hubdommed.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # The project's own pages (the API docs' Redoc page without third-party fonts).
        "DIRS": [BASE_DIR / "hubdommed" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": env.db("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/hubdommed"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # The same backend, asking first the host that served last (several hosts in the URL).
    DATABASES["default"]["ENGINE"] = "common.postgresql"
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DB_CONN_MAX_AGE", default=60, minimum=0))
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# libpq waits for a host that does not answer as long as TCP does (minutes): with several
# hosts in DATABASE_URL (a primary and its standbys, tried in order), one dead host would
# stall every connection attempt. Per host; a connect_timeout in the URL wins.
DATABASES["default"].setdefault("OPTIONS", {}).setdefault(
    "connect_timeout", env.int("DB_CONNECT_TIMEOUT", default=5, minimum=2)
)
# A host that vanishes once connected (a machine switched off, a network cut: no reset, no
# answer) would hold a statement, and every process waiting on it, for as long as TCP
# retries, about 15 minutes; a failover to a standby would wait as long. libpq gives such a
# connection up after DB_DEAD_HOST_TIMEOUT seconds instead, whether it was sending (data
# unacknowledged: ``tcp_user_timeout``) or waiting for an answer (keepalive probes from
# half of it on, three of them unanswered). A live server's kernel answers both, however
# long its statement runs. 0 leaves TCP's own. The same options in the URL win.
DB_DEAD_HOST_TIMEOUT = env.int("DB_DEAD_HOST_TIMEOUT", default=10, minimum=0)
if DB_DEAD_HOST_TIMEOUT:
    for _name, _value in {
        "tcp_user_timeout": DB_DEAD_HOST_TIMEOUT * 1000,
        "keepalives": 1,
        "keepalives_idle": max(1, DB_DEAD_HOST_TIMEOUT // 2),
        "keepalives_interval": max(1, DB_DEAD_HOST_TIMEOUT // 6),
        "keepalives_count": 3,
    }.items():
        DATABASES["default"]["OPTIONS"].setdefault(_name, _value)
# No statement of a daemon (the relay, the worker and its tasks, the scheduler, the
# monitor) waits for a row lock longer than this (seconds; 0: as long as its holder keeps
# it). A session that holds a lock without end (an operator's psql left in a transaction,
# a stalled request) would otherwise stop a daemon's cycle in silence, with the rows of its
# own transaction locked meanwhile: past it, the statement fails, the transaction is
# rolled back and tried again (the next cycle, the task's retry), and the error names the
# lock. Not for the other commands: ``migrate`` builds indexes concurrently, which waits
# for every older transaction and must not give up half-way. Sent as a connection option:
# behind PgBouncer, allow it (ignore_startup_parameters) or set it to 0.
# PostgreSQL takes at most 2147483 s (its milliseconds in an int); past it every
# connection of a daemon would be refused.
DB_LOCK_TIMEOUT = env.int("DB_LOCK_TIMEOUT", default=30, minimum=0, maximum=2_147_483)
if DB_LOCK_TIMEOUT and daemon_process():
    _options = DATABASES["default"]["OPTIONS"]
    _options["options"] = " ".join(
        filter(None, [_options.get("options"), f"-c lock_timeout={DB_LOCK_TIMEOUT}s"])
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_USER_MODEL = "identity.User"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# Admin messages stay on the server: one of them carries a worker credential shown once.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

STATIC_URL = "static/"
# Where `collectstatic` gathers the admin's and the API docs' files (`make run` and the image
# run it), for WhiteNoise to serve without DEBUG.
STATIC_ROOT = env.str("STATIC_ROOT", default=str(BASE_DIR / "var" / "static"), blank=False)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if not DEBUG
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
# Development serves straight from the apps' static folders, no collectstatic needed.
WHITENOISE_USE_FINDERS = DEBUG

# --- Redis: an accelerator only (the outbox wake signal, throttling counters) -------------
REDIS_URL = env.url("REDIS_URL", default="redis://127.0.0.1:6379/0", schemes=("redis", "rediss"))
REDIS_KEY_PREFIX = env.str("REDIS_KEY_PREFIX", default="hubdommed", blank=False)
# Seconds to wait for Redis before giving up: a request must never hang on it.
REDIS_SOCKET_TIMEOUT = env.float("REDIS_SOCKET_TIMEOUT", default=0.5, minimum=0.01)
# After a failed call this process skips Redis, and a thread of its own asks it this often
# (seconds) whether it answers again (common/accelerator.py): a hung Redis costs a process
# one timeout per outage, not one per request.
REDIS_HOLD_OFF_SECONDS = env.float("REDIS_HOLD_OFF_SECONDS", default=5.0, minimum=0)
OUTBOX_WAKE_KEY = f"{REDIS_KEY_PREFIX}:outbox:wake"
# Published after a job's output or status changed, with its id: its followers read again.
JOB_OUTPUT_CHANNEL = f"{REDIS_KEY_PREFIX}:job:output"

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": REDIS_KEY_PREFIX,
        "OPTIONS": {
            "socket_connect_timeout": REDIS_SOCKET_TIMEOUT,
            "socket_timeout": REDIS_SOCKET_TIMEOUT,
        },
    }
}

# --- Broker -------------------------------------------------------------------------------
BROKER = env.choice("BROKER", ("rabbitmq", "sqs"), default="rabbitmq")
# setup_broker (run by `make run` first) waits this long for a broker still starting.
BROKER_WAIT_SECONDS = env.float("BROKER_WAIT_SECONDS", default=60.0, minimum=0)
# One node, or a cluster's nodes comma-separated in the order to try: a connection lost or
# refused moves this process on to the next node (broker/rabbitmq/connection.py).
RABBITMQ_URL = env.urls(
    "RABBITMQ_URL", default="amqp://guest:guest@127.0.0.1:5672/%2F", schemes=("amqp", "amqps")
)
RABBITMQ_EXCHANGE = env.str("RABBITMQ_EXCHANGE", default="dom_med", blank=False)
# Queue names on either transport: <prefix><queue class>, and <prefix><queue class>-dlq.
QUEUE_PREFIX = env.str("QUEUE_PREFIX", default="hubdommed-")
AWS_REGION = env.str("AWS_REGION", default="us-east-1", blank=False)
SQS_ENDPOINT_URL = env.str("SQS_ENDPOINT_URL", default="") or None
EC2_ENDPOINT_URL = env.str("EC2_ENDPOINT_URL", default="") or None

# --- Outbox and relay ---------------------------------------------------------------------
TASKS_CATALOG = BASE_DIR / "tasks.json"
OUTBOX_MAX_ENVELOPE_BYTES = 256 * 1024
RELAY_ENABLED = env.bool("HUBDOMMED_RELAY", default=False)
RELAY_SWEEP_INTERVAL = env.float("RELAY_SWEEP_INTERVAL", default=2.0, minimum=0.05)
RELAY_BATCH_SIZE = env.int("RELAY_BATCH_SIZE", default=500, minimum=1)
# relay: a row the broker refused on its own waits before its next try, doubling each
# time up to the cap, so one poison row never keeps the relay busy.
RELAY_RETRY_BACKOFF = env.float("RELAY_RETRY_BACKOFF", default=1.0, minimum=0)
RELAY_RETRY_BACKOFF_MAX = env.float("RELAY_RETRY_BACKOFF_MAX", default=300.0, minimum=1)
# The longest delay a message may be dispatched with (7 days): dispatch refuses a longer
# one, and the monitor brings forward an unsent row due later than this (a clock gone
# wrong, a row written by hand), which nothing else would send for that long.
OUTBOX_MAX_DELAY_SECONDS = env.int("OUTBOX_MAX_DELAY_SECONDS", default=7 * 24 * 3600, minimum=60)

# --- Background workers -------------------------------------------------------------------
QUEUES = env.list("QUEUES", default=["critical", "default", "bulk", "maintenance"])
# A thread each (more processes beyond a thousand, not more threads).
WORKER_CONCURRENCY = env.int("WORKER_CONCURRENCY", default=4, minimum=1, maximum=1000)
WORKER_STOP_BUDGET = env.float("WORKER_STOP_BUDGET", default=30.0, minimum=0)
# The relay, the scheduler and the monitor end their stop within this many seconds of the
# signal, whatever they were blocked on (a database or broker that hung mid-answer): past
# it they say where they were and leave (exit 1). Below an orchestrator's grace (compose's
# 10 s), so that the line is written before a kill would end them in silence.
DAEMON_STOP_SECONDS = env.float("DAEMON_STOP_SECONDS", default=8.0, minimum=1)
# A claim or group commit of the task worker's window under way this long is a database
# that stopped answering: the worker's liveness file stops being rewritten (its health
# check fails) until it ends. Above DB_LOCK_TIMEOUT, which bounds a statement's lock wait.
WORKER_STALL_SECONDS = env.float("WORKER_STALL_SECONDS", default=90.0, minimum=1)
# Messages the broker may hand a task worker per slot, over all the queues it consumes (the
# process's window, docs/worker.md): deeper pays the window's two statements over more
# runs; shallower keeps long tasks' messages free for other workers.
WORKER_PREFETCH_PER_SLOT = env.int("WORKER_PREFETCH_PER_SLOT", default=16, minimum=1)
# worker runtime (docs/worker.md): a file that exists only while the worker is ready to
# take work (an orchestrator's readiness probe checks it); empty: none.
WORKER_READY_FILE = env.str("WORKER_READY_FILE", default="")
# SQS: seconds a received message stays invisible (0: the design's table per queue
# class) and between heartbeats that extend it (0: a third of the visibility).
# SQS takes at most 12 hours.
WORKER_VISIBILITY_TIMEOUT = env.float(
    "WORKER_VISIBILITY_TIMEOUT", default=0, minimum=0, maximum=43200
)
WORKER_HEARTBEAT_INTERVAL = env.float("WORKER_HEARTBEAT_INTERVAL", default=0, minimum=0)
# SQS long poll per receive (0-20 s): also how long a stop may wait for a poll to end.
WORKER_SQS_WAIT_SECONDS = env.int("WORKER_SQS_WAIT_SECONDS", default=5, minimum=0, maximum=20)
# RabbitMQ connection heartbeat in seconds (0: what the broker proposes).
WORKER_RABBITMQ_HEARTBEAT = env.int(
    "WORKER_RABBITMQ_HEARTBEAT", default=0, minimum=0, maximum=65535
)

# --- Identity -----------------------------------------------------------------------------
ACCESS_TOKEN_LIFETIME = timedelta(
    seconds=env.int("ACCESS_TOKEN_SECONDS", default=15 * 60, minimum=1)
)
REFRESH_TOKEN_LIFETIME = timedelta(
    seconds=env.int("REFRESH_TOKEN_SECONDS", default=30 * 24 * 3600, minimum=1)
)


def _login_rate(var: str, default: str) -> str:
    value = env.str(var, default).strip()
    if not re.fullmatch(r"[1-9][0-9]*/(second|minute|hour|day|s|m|h|d)", value):
        raise ImproperlyConfigured(f"{var}={value!r} is not a rate like '5/minute'")
    return value


# Login attempts allowed per client address and per email.
# Seconds after a refresh during which the same refresh token, presented again, gets the
# same successor pair (clients of one session refreshing at once) instead of counting as
# reuse, which ends the session. 0: every second presentation is reuse.
REFRESH_REUSE_GRACE_SECONDS = env.int("REFRESH_REUSE_GRACE_SECONDS", default=10, minimum=0)
LOGIN_RATE_PER_IP = _login_rate("LOGIN_RATE_PER_IP", "20/minute")
LOGIN_RATE_PER_EMAIL = _login_rate("LOGIN_RATE_PER_EMAIL", "5/minute")
# How many proxies in front of the API append to X-Forwarded-For (0: use the peer address).
TRUSTED_PROXY_COUNT = env.int("TRUSTED_PROXY_COUNT", default=0, minimum=0)

# --- Jobs -------------------------------------------------------------------------------
# How long a claim lives without a heartbeat; a worker heartbeats well within it (a third).
JOB_LEASE_SECONDS = env.int("JOB_LEASE_SECONDS", default=60, minimum=5)
# Limits on what a job carries (bytes of compact JSON; characters of output kept).
JOB_PARAMS_MAX_BYTES = env.int("JOB_PARAMS_MAX_BYTES", default=64 * 1024, minimum=2)
# The most time checking one job's parameters against its automation's schema may take
# (regular expressions included); past it the job is refused (409 automation_misconfigured).
JOB_PARAMS_VALIDATION_SECONDS = env.float(
    "JOB_PARAMS_VALIDATION_SECONDS", default=0.5, minimum=0.01
)
JOB_RESULT_MAX_BYTES = env.int("JOB_RESULT_MAX_BYTES", default=256 * 1024, minimum=2)
JOB_OUTPUT_TAIL_MAX_CHARS = env.int("JOB_OUTPUT_TAIL_MAX_CHARS", default=16 * 1024, minimum=1)
# A running job's output as its worker sends it (POST /jobs/{id}/output): the most one
# chunk may hold, and the most a job's stored log keeps (past it the oldest chunks go).
JOB_OUTPUT_CHUNK_MAX_CHARS = env.int("JOB_OUTPUT_CHUNK_MAX_CHARS", default=64 * 1024, minimum=1)
JOB_OUTPUT_MAX_CHARS = env.int("JOB_OUTPUT_MAX_CHARS", default=1_000_000, minimum=1)
# Following a job's output live (GET /jobs/{id}/output/stream, served by hubdommed.asgi):
# how often a follower reads the log when no Redis wake came (Redis only makes it sooner),
# the most one stream lasts (its client resumes from the last offset it got), and how long
# a quiet stream waits before a comment that keeps proxies from closing it.
JOB_OUTPUT_FOLLOW_POLL_SECONDS = env.float(
    "JOB_OUTPUT_FOLLOW_POLL_SECONDS", default=1.0, minimum=0.05
)
JOB_OUTPUT_FOLLOW_MAX_SECONDS = env.float(
    "JOB_OUTPUT_FOLLOW_MAX_SECONDS", default=3600.0, minimum=1
)
JOB_OUTPUT_FOLLOW_KEEPALIVE_SECONDS = env.float(
    "JOB_OUTPUT_FOLLOW_KEEPALIVE_SECONDS", default=15.0, minimum=0.1
)
# The pause a client is told to take before it comes back (SSE's ``retry``): after a
# stream ends early, and between the API's own answers to a follower (see docs/api.md).
JOB_OUTPUT_FOLLOW_RETRY_MS = env.int("JOB_OUTPUT_FOLLOW_RETRY_MS", default=1000, minimum=1)
# The streams one stream process holds at most, in all and for one tenant (past them a
# follower gets a 429), and how long a client may read nothing before its stream is closed
# (one that never reads would otherwise hold its stream, and the bytes waiting for it,
# for ever).
JOB_OUTPUT_FOLLOW_MAX_STREAMS = env.int("JOB_OUTPUT_FOLLOW_MAX_STREAMS", default=1000, minimum=1)
JOB_OUTPUT_FOLLOW_MAX_PER_TENANT = env.int(
    "JOB_OUTPUT_FOLLOW_MAX_PER_TENANT", default=100, minimum=1
)
JOB_OUTPUT_FOLLOW_STALL_SECONDS = env.float(
    "JOB_OUTPUT_FOLLOW_STALL_SECONDS", default=60.0, minimum=0.1
)
# Days a finished job's log is kept after its end; then the stuck-job monitor deletes its
# chunks (the job keeps its output_tail). 0 keeps every log forever.
JOB_OUTPUT_RETENTION_DAYS = env.int("JOB_OUTPUT_RETENTION_DAYS", default=30, minimum=0)

# --- Schedules (manage.py run_scheduler) ---------------------------------------------------
# Seconds between the scheduler's cycles: how late a due run may start at most.
SCHEDULER_INTERVAL_SECONDS = env.float("SCHEDULER_INTERVAL_SECONDS", default=5.0, minimum=0.1)
# A due time started later than this many seconds (the hub was down) is a missed run: a
# schedule with misfire "skip" drops it; "run_once" starts the latest missed run only.
SCHEDULE_MISFIRE_GRACE_SECONDS = env.int(
    "SCHEDULE_MISFIRE_GRACE_SECONDS", default=5 * 60, minimum=1
)
# Schedules a tenant may have (active and paused; deactivated ones do not count).
SCHEDULE_MAX_PER_TENANT = env.int("SCHEDULE_MAX_PER_TENANT", default=300, minimum=1)
# Seconds of parameter checks (each up to JOB_PARAMS_VALIDATION_SECONDS) one scheduler cycle
# makes at most, in all and for one tenant; schedules left unchecked wait for the next cycle.
SCHEDULER_PARAMS_CHECK_SECONDS = env.float(
    "SCHEDULER_PARAMS_CHECK_SECONDS", default=5.0, minimum=0.01
)
SCHEDULER_PARAMS_CHECK_TENANT_SECONDS = env.float(
    "SCHEDULER_PARAMS_CHECK_TENANT_SECONDS", default=1.0, minimum=0.01
)

# --- Stuck-job monitor (manage.py watch_stuck_jobs) ---------------------------------------
# Seconds between cycles (--interval overrides it).
MONITOR_INTERVAL_SECONDS = env.float("MONITOR_INTERVAL_SECONDS", default=30.0, minimum=0.1)
# A job pending longer than this gets its machine powered on again.
MONITOR_PENDING_SECONDS = env.int("MONITOR_PENDING_SECONDS", default=3 * 60, minimum=1)
# A worker not heard from for this long while its automation has jobs pending (at least as
# long) is restarted through its machine's provider (crashed, hung, or a stale credential).
MONITOR_WORKER_SILENT_SECONDS = env.int("MONITOR_WORKER_SILENT_SECONDS", default=60, minimum=1)
# An ec2 machine not seen for this long, with no pending or running job, is stopped.
MONITOR_EC2_IDLE_SECONDS = env.int("MONITOR_EC2_IDLE_SECONDS", default=15 * 60, minimum=1)
# A task run whose message nothing has claimed this long after it was sent (or after its
# lease expired, or its retry was due) is stranded: the broker lost it or dead-lettered it.
# Its outbox row is re-armed once, or the run is failed when it had all its receives.
# Longer than any backlog the broker's queues are expected to hold.
MONITOR_STRANDED_RUN_SECONDS = env.int("MONITOR_STRANDED_RUN_SECONDS", default=3600, minimum=1)

# --- API ----------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["identity.authentication.AccessTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON only, DEBUG or not: the browsable API renders HTML forms that touch the views'
    # querysets and failed on some of them; /api/docs/ is the page for people.
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "common.negotiation.JSONFallbackNegotiation",
    "DEFAULT_PARSER_CLASSES": ["common.parsers.JSONParser"],
    "DEFAULT_SCHEMA_CLASS": "common.schema.AutoSchema",
    "EXCEPTION_HANDLER": "common.api.exception_handler",
    "DEFAULT_PAGINATION_CLASS": "common.api.DefaultPagination",
    "PAGE_SIZE": 50,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Hub DomMed API",
    "DESCRIPTION": (
        "Organizations trigger automations that run on dedicated machines. "
        "People authenticate with `Authorization: Bearer <access token>`; an automation's "
        "worker sends its own credential in the same header."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema is public: a stale token sent out of habit must not turn it into a 401.
    "SERVE_AUTHENTICATION": [],
    "COMPONENT_SPLIT_REQUEST": True,
    # Each operation under its resource's tag (the path's first part after the version):
    # the docs group the API by app, the worker's own API apart.
    "SCHEMA_PATH_PREFIX": r"/api/v[0-9]+",
    "TAGS": [
        {"name": "auth", "description": "Logging in, tokens, and who the caller is."},
        {"name": "tenants", "description": "Organizations (platform admins)."},
        {"name": "users", "description": "A tenant's people."},
        {"name": "sectors", "description": "The sectors automations belong to."},
        {"name": "automations", "description": "What can run, and its worker's credential."},
        {"name": "jobs", "description": "Runs of an automation, from request to result."},
        {"name": "schedules", "description": "Jobs started on a cron calendar."},
        {"name": "webhooks", "description": "Endpoints told of jobs' events, and deliveries."},
        {"name": "events", "description": "The audit trail: what happened, who did it, when."},
        {"name": "worker", "description": "The automation's worker: poll, claim, report."},
    ],
    # Swagger UI and Redoc from the API's own static files (drf-spectacular-sidecar): the
    # docs work on a machine without internet, and load no third-party script.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # A job's status and a worker's status are both "status": name each enum.
    "ENUM_NAME_OVERRIDES": {
        "JobStatusEnum": "job.models.JobStatus",
        "WorkerStatusEnum": "automation.models.Worker.Status",
        "WebhookEndpointStatusEnum": "webhook.models.EndpointStatus",
    },
}

# Error reports (the DEBUG page, error e-mails) hide URLs and credentials too.
DEFAULT_EXCEPTION_REPORTER_FILTER = "common.debug.ExceptionReporterFilter"

# --- Readiness (/health/ready) -------------------------------------------------------------
# Seconds one attempt of a dependency's check may take, and all its attempts together (an
# orchestrator's probe timeout should be longer than the budget).
HEALTH_CHECK_TIMEOUT = env.float("HEALTH_CHECK_TIMEOUT", default=2.5, minimum=0.05)
HEALTH_READY_BUDGET = env.float("HEALTH_READY_BUDGET", default=6.0, minimum=0.1)
# How long a dependency's success stands for the probes that follow (0: check every time).
HEALTH_READY_CACHE_SECONDS = env.float("HEALTH_READY_CACHE_SECONDS", default=5.0, minimum=0)

# --- Logging: one line per record, to stderr (the service manager collects it) ------------
LOG_LEVEL = env.choice("LOG_LEVEL", ("debug", "info", "warning", "error"), default="info").upper()
# One JSON object per line in production (a log system parses them), a readable line in
# development; both carry correlation_id, run_id, job_id and tenant_id where known.
LOG_FORMAT = env.choice("LOG_FORMAT", ("json", "text"), default="text" if DEBUG else "json")
# A busy process writes its lines below warnings together, this often; a quiet one each as
# it comes (a write per line, 0, costs a busy worker a third of its rate:
# common.logs.StderrHandler).
LOG_FLUSH_SECONDS = env.float("LOG_FLUSH_SECONDS", default=0.1, minimum=0)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "common.logs.ContextFilter"}},
    "formatters": {
        "text": {"()": "common.logs.TextFormatter"},
        "json": {
            "()": "common.logs.JsonFormatter",
            "fmt": "%(levelname)s %(name)s %(message)s",
            "rename_fields": {"levelname": "level", "name": "logger"},
            "timestamp": "time",
        },
    },
    "handlers": {
        "stderr": {
            "()": "common.logs.StderrHandler",
            "flush_seconds": LOG_FLUSH_SECONDS,
            "formatter": LOG_FORMAT,
            "filters": ["context"],
        }
    },
    "root": {"handlers": ["stderr"], "level": LOG_LEVEL},
    "loggers": {
        # Django's own console handler (DEBUG only) would print each 4xx a second time, as
        # plain text: its records go through the root's handler alone.
        "django": {"handlers": []},
        "django.server": {"level": "WARNING"},
        "pika": {"level": "WARNING"},
        "botocore": {"level": "WARNING"},
    },
}
if LOG_FORMAT == "json":
    from common.logs import log_uncaught_exceptions

    log_uncaught_exceptions(LOGGING)

# --- Tracing (OpenTelemetry; common.tracing) -------------------------------------------------
# Off unless configured with the SDK's own variables: an exporter named in
# OTEL_TRACES_EXPORTER (otlp, console; "none" is off), or an OTLP endpoint
# (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, http/protobuf), which
# means otlp. OTEL_SDK_DISABLED=true turns it off whatever else is set. Sampling
# (OTEL_TRACES_SAMPLER), headers and timeouts are the SDK's variables too.
_TRACES_EXPORTERS = ("otlp", "console", "none")
TRACING_EXPORTERS = tuple(
    name.lower()
    for name in env.list(
        "OTEL_TRACES_EXPORTER",
        default=(
            ["otlp"]
            if env.str("OTEL_EXPORTER_OTLP_ENDPOINT", default="")
            or env.str("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", default="")
            else ["none"]
        ),
    )
)
if unknown_exporters := set(TRACING_EXPORTERS) - set(_TRACES_EXPORTERS):
    raise ImproperlyConfigured(
        f"OTEL_TRACES_EXPORTER={','.join(TRACING_EXPORTERS)!r}: unknown "
        f"{', '.join(sorted(unknown_exporters))}; use {', '.join(_TRACES_EXPORTERS)}"
    )
TRACING_EXPORTERS = tuple(name for name in TRACING_EXPORTERS if name != "none")
TRACING_ENABLED = bool(TRACING_EXPORTERS) and not env.bool("OTEL_SDK_DISABLED", default=False)
TRACING_SERVICE_NAME = env.str("OTEL_SERVICE_NAME", default="hubdommed", blank=False)

# --- Metrics ------------------------------------------------------------------------------
# The port a daemon (run_relay, run_worker, watch_stuck_jobs, run_scheduler) serves /metrics
# on; 0: off. `make run` gives each daemon its own (docs/OPERATIONS.md).
METRICS_PORT = env.int("METRICS_PORT", default=0, minimum=0, maximum=65535)
# The address it listens on: loopback unless told otherwise (0.0.0.0 in a container, where
# the orchestrator decides who reaches the port).
METRICS_HOST = env.str("METRICS_HOST", default="127.0.0.1", blank=False)
# A file the daemon touches after each loop iteration, for a container's health check
# (empty: none).
LIVENESS_FILE = env.str("LIVENESS_FILE", default="")
# The API's /metrics answers only `Authorization: Bearer <this>` when set (empty: anyone who
# reaches the API may read it; the figures carry no tenant's data).
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")

# Only behind a proxy that sets X-Forwarded-Proto itself: otherwise any client could claim
# that its plain-HTTP request came over HTTPS.
TRUST_X_FORWARDED_PROTO = env.bool("TRUST_X_FORWARDED_PROTO", default=False)
if TRUST_X_FORWARDED_PROTO:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
if not DEBUG:
    SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=True)
    CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=True)
    # Plain HTTP is sent to HTTPS where the API can tell which is which: behind the TLS proxy
    # TRUST_X_FORWARDED_PROTO names (without it every request would look like plain HTTP).
    SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=TRUST_X_FORWARDED_PROTO)
    # Probes inside the network speak plain HTTP to the container.
    SECURE_REDIRECT_EXEMPT = [r"^health/"]
    # Browsers keep to HTTPS once they saw it (sent on HTTPS answers only).
    SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=365 * 24 * 3600, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=True)
    SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=True)

# Access tokens are signed with their own key when one is given (rotating it logs everyone out
# without touching sessions or password resets), else with SECRET_KEY.
ACCESS_TOKEN_SIGNING_KEY = env.str("ACCESS_TOKEN_SIGNING_KEY", default="") or SECRET_KEY

# --- Webhooks -----------------------------------------------------------------------------
# true only in development and tests: deliveries may then reach loopback and private
# addresses (never the cloud's metadata service), and plain-HTTP endpoints are accepted.
WEBHOOK_ALLOW_PRIVATE_ADDRESSES = env.bool("WEBHOOK_ALLOW_PRIVATE_ADDRESSES", default=False)
# Seconds to connect, to wait for each read of the answer, and for the whole request.
WEBHOOK_CONNECT_TIMEOUT = env.float("WEBHOOK_CONNECT_TIMEOUT", default=3.0, minimum=0.05)
WEBHOOK_READ_TIMEOUT = env.float("WEBHOOK_READ_TIMEOUT", default=5.0, minimum=0.05)
WEBHOOK_TIMEOUT = env.float("WEBHOOK_TIMEOUT", default=10.0, minimum=0.1)
# Bytes of a receiver's answer read (the rest is never read); the first 1 KiB is kept.
WEBHOOK_MAX_RESPONSE_BYTES = env.int("WEBHOOK_MAX_RESPONSE_BYTES", default=4096, minimum=0)
# Redirects followed (307/308 only, each hop checked like the first); 0: none.
WEBHOOK_MAX_REDIRECTS = env.int("WEBHOOK_MAX_REDIRECTS", default=0, minimum=0)
# Seconds before each retry of a delivery that timed out or got 429/5xx: about a day in all.
_retry_delays = env.list(
    "WEBHOOK_RETRY_DELAYS",
    default=["5", "30", "120", "600", "1800", "3600", "7200", "14400", "28800", "28800"],
)
try:
    WEBHOOK_RETRY_DELAYS = [float(delay) for delay in _retry_delays]
except ValueError:
    WEBHOOK_RETRY_DELAYS = []
if not WEBHOOK_RETRY_DELAYS or any(delay < 0 for delay in WEBHOOK_RETRY_DELAYS):
    raise ImproperlyConfigured(
        f"WEBHOOK_RETRY_DELAYS={','.join(_retry_delays)!r} must be non-negative seconds, "
        "comma-separated"
    )
# The outbox takes no delay past its bound (OUTBOX_MAX_DELAY_SECONDS): a retry must fit.
if max(WEBHOOK_RETRY_DELAYS) > OUTBOX_MAX_DELAY_SECONDS:
    raise ImproperlyConfigured(
        f"WEBHOOK_RETRY_DELAYS has a delay longer than OUTBOX_MAX_DELAY_SECONDS "
        f"({OUTBOX_MAX_DELAY_SECONDS})"
    )
# An endpoint whose every attempt failed for this long is disabled (5 days).
WEBHOOK_DISABLE_AFTER_SECONDS = env.int(
    "WEBHOOK_DISABLE_AFTER_SECONDS", default=5 * 24 * 3600, minimum=60
)
# Keys that encrypt webhook signing secrets at rest (Fernet keys: 32 bytes, URL-safe base64;
# `python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"`),
# comma-separated: the first encrypts, every one decrypts, so that the key can rotate
# (docs/OPERATIONS.md). As with SECRET_KEY, a development key exists only in DEBUG.
_DEV_WEBHOOK_SECRET_KEY = base64.urlsafe_b64encode(
    hashlib.sha256(b"hubdommed webhook secrets: development only, never production").digest()
).decode()
WEBHOOK_SECRET_KEYS = [
    key.strip()
    for key in env.list("WEBHOOK_SECRET_KEYS", default=[_DEV_WEBHOOK_SECRET_KEY] if DEBUG else [])
    if key.strip()
]
if not WEBHOOK_SECRET_KEYS:
    raise ImproperlyConfigured("WEBHOOK_SECRET_KEYS must be set when DEBUG is off")
if not DEBUG and _DEV_WEBHOOK_SECRET_KEY in WEBHOOK_SECRET_KEYS:
    raise ImproperlyConfigured(
        "WEBHOOK_SECRET_KEYS holds the development key; set real keys (DEBUG is off)"
    )
for _position, _key in enumerate(WEBHOOK_SECRET_KEYS, start=1):
    try:
        Fernet(_key)
    except ValueError:
        raise ImproperlyConfigured(
            f"WEBHOOK_SECRET_KEYS: key {_position} is not a Fernet key "
            "(32 bytes in URL-safe base64)"
        ) from None
# After a rotation the old secret keeps signing too for this long (24 hours).
WEBHOOK_SECRET_GRACE_SECONDS = env.int("WEBHOOK_SECRET_GRACE_SECONDS", default=86400, minimum=0)
# The run that erases the old secret when the grace ends is a delayed outbox run: it must fit.
if WEBHOOK_SECRET_GRACE_SECONDS + 1 > OUTBOX_MAX_DELAY_SECONDS:
    raise ImproperlyConfigured(
        "WEBHOOK_SECRET_GRACE_SECONDS is longer than OUTBOX_MAX_DELAY_SECONDS "
        f"({OUTBOX_MAX_DELAY_SECONDS})"
    )
# A slow or failing receiver gets one attempt in flight at a time: an attempt running for
# longer than this marks it slow, and its other deliveries wait this long before trying again.
WEBHOOK_SLOW_SECONDS = env.float("WEBHOOK_SLOW_SECONDS", default=1.0, minimum=0.05)
WEBHOOK_DEFER_SECONDS = env.float("WEBHOOK_DEFER_SECONDS", default=2.0, minimum=0.05)
# While an endpoint fails, its probe comes back after a twentieth of how long it has been
# failing (a second at least), and at most this many seconds: a receiver that answers again
# gets its backlog within seconds after a short outage, and within this after a long one.
WEBHOOK_PROBE_MAX_SECONDS = env.float("WEBHOOK_PROBE_MAX_SECONDS", default=30.0, minimum=1.0)
# A disabled endpoint's pending deliveries are held for its enable this long at most (from
# when the event happened); then they end failed, with the reason.
WEBHOOK_HELD_MAX_AGE_SECONDS = env.int(
    "WEBHOOK_HELD_MAX_AGE_SECONDS", default=7 * 24 * 3600, minimum=60
)
# Active endpoints a tenant may have (disabled ones do not count); one more is refused.
WEBHOOK_MAX_ENDPOINTS_PER_TENANT = env.int(
    "WEBHOOK_MAX_ENDPOINTS_PER_TENANT", default=50, minimum=1
)
# CA bundle that verifies receivers' certificates (default: certifi's).
WEBHOOK_CA_BUNDLE = env.str("WEBHOOK_CA_BUNDLE", default="")

# --- Machines and the automation worker ---------------------------------------------------
# Where an automation's worker reaches the hub's API.
HUB_URL = env.url("HUB_URL", default="http://127.0.0.1:8000", schemes=("http", "https"))
# The automation worker: how often it polls the hub for pending jobs (besides its queue),
# and how long it waits with nothing to do before it exits (0: never; a local machine
# powering off).
AGENT_POLL_INTERVAL = env.float("AGENT_POLL_INTERVAL", default=5.0, minimum=0.05)
AGENT_IDLE_TIMEOUT = env.float("AGENT_IDLE_TIMEOUT", default=600.0, minimum=0)
# The local provider's lock, pid and log files, one set per automation.
LOCAL_MACHINES_DIR = env.str(
    "LOCAL_MACHINES_DIR", default=str(BASE_DIR / "var" / "machines"), blank=False
)
# Where seed_demo (run by `make run`) keeps the demo manager's login (default:
# var/demo-login.txt in the checkout).
DEMO_LOGIN_FILE = env.str(
    "DEMO_LOGIN_FILE", default=str(BASE_DIR / "var" / "demo-login.txt"), blank=False
)
# Where the automation worker keeps the outcomes the hub has not taken yet, on its machine's
# disk (<dir>/<slug>.outcomes/); empty: LOCAL_MACHINES_DIR (a local machine's disk).
AGENT_STATE_DIR = env.str("AGENT_STATE_DIR", default="")
# The longest pause between two attempts at reporting an outcome to a hub that is away.
AGENT_REPORT_BACKOFF_MAX = env.float("AGENT_REPORT_BACKOFF_MAX", default=30.0, minimum=0.1)
