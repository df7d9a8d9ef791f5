"""Checking usage events before they reach the ledger: every field typed
and in range, tenants, models and replicas known, times in order and not in
the future. One pass per event with plain Python (no serializer): the
ingestion path must sustain tens of thousands of events per second.

An event is a mapping with the ledger's field names. Foreign things may be
named by id (`tenant_id`, `replica_id`, `pool_id`) or, for serving tiers that
do not know our ids, by `tenant` (slug) and `replica` (name)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.utils import timezone

from metering.choices import Phase, Timing
from metering.retention import horizon_start, retention_months
from serving.choices import ReplicaRole, RequestStatus
from serving.models import LoraAdapter, Pool, Replica, ServedModel
from tenants.models import Tenant

# The ledger's columns, in the order rows are copied, with their types.
LEDGER_COLUMN_TYPES = (
    ("request_id", "varchar"),
    ("tenant_id", "int8"),
    ("api_key_id", "int8"),
    ("model", "varchar"),
    ("served_model_id", "int8"),
    ("replica_id", "int8"),
    ("pool_id", "int8"),
    ("priority", "int4"),
    ("stream", "bool"),
    ("prompt_tokens", "int4"),
    ("cached_tokens", "int4"),
    ("completion_tokens", "int4"),
    ("received_at", "timestamptz"),
    ("sent_at", "timestamptz"),
    ("first_token_at", "timestamptz"),
    ("ended_at", "timestamptz"),
    ("queue_ms", "numeric"),
    ("ttft_ms", "numeric"),
    ("generation_ms", "numeric"),
    ("gateway_queue_ms", "numeric"),
    ("timing", "varchar"),
    ("phase", "varchar"),
    ("status", "varchar"),
    ("http_status", "int2"),
    ("error", "varchar"),
    ("source", "varchar"),
    ("synthetic", "bool"),
)
LEDGER_COLUMNS = tuple(name for name, _ in LEDGER_COLUMN_TYPES)
LEDGER_TYPES = tuple(kind for _, kind in LEDGER_COLUMN_TYPES)
MAX_TOKENS = 2**31 - 1
MAX_MS = Decimal("99999999999.999")
MILLISECOND = Decimal("0.001")
CLOCK_SKEW = timedelta(minutes=5)  # how far in the future an event may claim to end
SKEW_TOLERANCE = timedelta(seconds=1)  # between the gateway's clock and vLLM's timings
SERVED_STATUSES = frozenset({RequestStatus.OK, RequestStatus.ABORTED})
STATUSES = frozenset(RequestStatus.values)
PHASES = frozenset(Phase.values)


class EventInvalid(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class DirectoryStale(Exception):
    """An offline validator met a name its directory does not know."""


@dataclass
class Directory:
    """What events may refer to, loaded from the database and kept a few
    seconds; a name it does not know makes it reload once before refusing."""

    tenants_by_id: dict[int, int] = field(default_factory=dict)  # every tenant, active or not
    tenants_by_slug: dict[str, int] = field(default_factory=dict)
    replicas_by_id: dict[int, tuple[int, int]] = field(default_factory=dict)  # (pool, model)
    replica_roles: dict[int, str] = field(default_factory=dict)  # id -> both | prefill | decode
    replicas_by_name: dict[str, int] = field(default_factory=dict)
    models: dict[str, int] = field(default_factory=dict)  # public name -> served model id
    adapters: dict[str, tuple[int, int]] = field(default_factory=dict)  # (tenant, base model)
    pools: set[int] = field(default_factory=set)
    loaded_at: float = 0.0  # ok-float: monotonic seconds

    @classmethod
    def load(cls) -> Directory:
        d = cls(loaded_at=time.monotonic())
        for pk, slug in Tenant.objects.values_list("pk", "slug"):
            d.tenants_by_id[pk] = pk
            d.tenants_by_slug[slug] = pk
        for pk, name, pool_id, model_id, role in Replica.objects.values_list(
            "pk", "name", "pool_id", "model_id", "role"
        ):
            d.replicas_by_id[pk] = (pool_id, model_id)
            d.replica_roles[pk] = role
            d.replicas_by_name[name] = pk
            d.pools.add(pool_id)
        d.pools.update(Pool.objects.values_list("pk", flat=True))
        d.models = dict(ServedModel.objects.values_list("name", "pk"))
        for name, tenant_id, base_id in LoraAdapter.objects.values_list(
            "name", "tenant_id", "base_model_id"
        ):
            d.adapters[name] = (tenant_id, base_id)
        return d


_directory = Directory()


def directory(*, refresh: bool = False) -> Directory:
    global _directory
    max_age = settings.METERING["DIRECTORY_SECONDS"]
    if refresh or time.monotonic() - _directory.loaded_at > max_age:
        _directory = Directory.load()
    return _directory


class EventValidator:
    """Turns one event mapping into a ledger row (a tuple in LEDGER_COLUMNS
    order), or raises EventInvalid naming the field."""

    def __init__(self, *, source: str, now: datetime | None = None, offline: bool = False) -> None:
        """`offline`: never query the database (a COPY holds the connection);
        a name the directory does not know raises DirectoryStale instead of
        reloading it."""
        self.source = source
        now = now or timezone.now()
        self.latest = now + CLOCK_SKEW
        # The ledger's idempotency horizon (metering.retention): older usage
        # is archived, and could no longer be told from usage recorded before.
        self.earliest = horizon_start(now)
        self.max_duration = timedelta(seconds=settings.METERING["MAX_REQUEST_SECONDS"])
        self.directory = directory()
        self._refreshed = False
        self._offline = offline

    def refreshed(self) -> EventValidator:
        """This validator with the directory just reloaded: an unknown name
        is now an error."""
        self.directory, self._refreshed = directory(refresh=True), True
        return self

    def _lookup(self, table: str, key: Any) -> Any:
        found = getattr(self.directory, table).get(key)
        if found is None and not self._refreshed:
            if self._offline:
                raise DirectoryStale(table)
            self.refreshed()
            found = getattr(self.directory, table).get(key)
        return found

    def row(self, event: Mapping[str, Any]) -> tuple:
        if type(event) is not dict and not isinstance(event, Mapping):
            raise EventInvalid("event", "must be an object")
        get = event.get
        request_id = get("request_id")
        if not isinstance(request_id, str) or not 0 < len(request_id) <= 128:
            raise EventInvalid("request_id", "required, a string of 1 to 128 characters")

        tenant_id = self._tenant(get)
        status = get("status")
        if status not in STATUSES:
            raise EventInvalid("status", f"must be one of {', '.join(sorted(STATUSES))}")
        model = get("model") or ""
        if not isinstance(model, str) or len(model) > 200:
            raise EventInvalid("model", "must be a string of at most 200 characters")
        served_model_id = self._served_model(model, tenant_id, required=status != "rejected")
        replica_id, pool_id = self._replica(get, required=status in SERVED_STATUSES)

        prompt = _count(get, "prompt_tokens")
        cached = _count(get, "cached_tokens")
        completion = _count(get, "completion_tokens")
        if cached > prompt:
            raise EventInvalid("cached_tokens", "must not exceed prompt_tokens")

        received_at = _time(get, "received_at", required=True)
        ended_at = _time(get, "ended_at", required=True)
        sent_at = _time(get, "sent_at")
        first_token_at = _time(get, "first_token_at")
        if ended_at < received_at:
            raise EventInvalid("ended_at", "is before received_at")
        if ended_at > self.latest:
            raise EventInvalid("ended_at", "is in the future")
        if ended_at < self.earliest or received_at < self.earliest:
            raise EventInvalid(
                "ended_at" if ended_at < self.earliest else "received_at",
                f"is before the ledger's retention horizon ({self.earliest:%Y-%m-%d}, "
                f"METERING_RETENTION_MONTHS={retention_months()}): usage that old is archived "
                "and can no longer be told from usage recorded before",
            )
        if ended_at - received_at > self.max_duration:
            raise EventInvalid(
                "ended_at", f"request lasted over {self.max_duration.total_seconds():.0f} s"
            )
        sent_at = _within(sent_at, "sent_at", received_at, ended_at)
        first_token_at = _within(first_token_at, "first_token_at", received_at, ended_at)

        http_status = get("http_status", 200 if status == "ok" else 0)
        if type(http_status) is not int or not 0 <= http_status <= 999:
            raise EventInvalid("http_status", "must be an integer HTTP status")
        priority = get("priority", 0)
        if type(priority) is not int or not -(2**31) <= priority < 2**31:
            raise EventInvalid("priority", "must be a 32-bit integer")
        stream = get("stream", False)
        if type(stream) is not bool:
            raise EventInvalid("stream", "must be true or false")
        api_key_id = get("api_key_id")
        if api_key_id is not None and type(api_key_id) is not int:
            raise EventInvalid("api_key_id", "must be an integer")
        error = get("error") or ""
        if not isinstance(error, str):
            raise EventInvalid("error", "must be a string")
        engine_timings = (
            _millis(get, "queue_ms"),
            _millis(get, "ttft_ms"),
            _millis(get, "generation_ms"),
        )
        return (
            request_id,
            tenant_id,
            api_key_id,
            model,
            served_model_id,
            replica_id,
            pool_id,
            priority,
            stream,
            prompt,
            cached,
            completion,
            received_at,
            sent_at,
            first_token_at,
            ended_at,
            *engine_timings,
            _millis(get, "gateway_queue_ms"),
            _timing(get, engine_timings),
            self._phase(get, replica_id),
            status,
            http_status,
            error[:300],
            self.source,
            bool(get("synthetic", False)),
        )

    def _phase(self, get, replica_id: int | None) -> str:
        """A row of a disaggregated request names its phase, and its replica
        serves that phase; a replica of a disaggregated pool serves phases
        only."""
        phase = get("phase") or Phase.WHOLE
        if phase not in PHASES:
            raise EventInvalid("phase", "must be 'whole', 'prefill' or 'decode'")
        if replica_id is None:
            if phase != Phase.WHOLE:
                raise EventInvalid("replica_id", "required for a prefill or decode row")
            return phase
        role = self.directory.replica_roles.get(replica_id, ReplicaRole.BOTH)
        if phase == Phase.WHOLE and role != ReplicaRole.BOTH:
            raise EventInvalid(
                "phase", f"the replica serves the {role} phase of a disaggregated pool: name it"
            )
        if phase != Phase.WHOLE and role != phase:
            serves = "both phases" if role == ReplicaRole.BOTH else f"the {role} phase"
            raise EventInvalid("phase", f"the replica serves {serves}, not {phase}")
        return phase

    def _tenant(self, get) -> int:
        tenant_id = get("tenant_id")
        if tenant_id is not None:
            if type(tenant_id) is not int or self._lookup("tenants_by_id", tenant_id) is None:
                raise EventInvalid("tenant_id", f"unknown tenant {tenant_id!r}")
            return tenant_id
        slug = get("tenant")
        found = self._lookup("tenants_by_slug", slug) if isinstance(slug, str) else None
        if found is None:
            raise EventInvalid("tenant", f"unknown tenant {slug!r}")
        return found

    def _served_model(self, model: str, tenant_id: int, *, required: bool) -> int | None:
        served = self._lookup("models", model) if model else None
        if served is not None:
            return served
        adapter = self._lookup("adapters", model) if model else None
        if adapter is not None and adapter[0] == tenant_id:
            return adapter[1]
        if required:
            raise EventInvalid("model", f"unknown model {model!r}")
        return None

    def _replica(self, get, *, required: bool) -> tuple[int | None, int | None]:
        replica_id = get("replica_id")
        if replica_id is None and get("replica") is not None:
            name = get("replica")
            replica_id = self._lookup("replicas_by_name", name) if isinstance(name, str) else None
            if replica_id is None:
                raise EventInvalid("replica", f"unknown replica {name!r}")
        pool_id = get("pool_id")
        if replica_id is None:
            if required:
                raise EventInvalid("replica_id", "required for served (ok, aborted) requests")
            return None, None
        found = self._lookup("replicas_by_id", replica_id) if type(replica_id) is int else None
        if found is None:
            raise EventInvalid("replica_id", f"unknown replica {replica_id!r}")
        if pool_id is None:
            return replica_id, found[0]
        if type(pool_id) is not int or pool_id not in self.directory.pools:
            raise EventInvalid("pool_id", f"unknown pool {pool_id!r}")
        return replica_id, pool_id


def _count(get, name: str) -> int:
    value = get(name, 0)
    if value is None:
        return 0
    if type(value) is not int:
        raise EventInvalid(name, "must be an integer")
    if not 0 <= value <= MAX_TOKENS:
        raise EventInvalid(name, "must not be negative" if value < 0 else "is too large")
    return value


def _time(get, name: str, *, required: bool = False) -> datetime | None:
    value = get(name)
    if type(value) is datetime and value.tzinfo is not None:
        return value
    if value is None:
        if required:
            raise EventInvalid(name, "required")
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise EventInvalid(name, "must be an ISO 8601 timestamp") from None
    if not isinstance(value, datetime):
        raise EventInvalid(name, "must be an ISO 8601 timestamp")
    if value.tzinfo is None:
        raise EventInvalid(name, "must include a timezone (UTC offset)")
    return value


def _within(
    value: datetime | None, name: str, received_at: datetime, ended_at: datetime
) -> datetime | None:
    """`value` must lie in [received_at, ended_at]. Timings derived from
    another clock (vLLM's) may stray by a little: those are pulled inside
    rather than losing the event; beyond SKEW_TOLERANCE they are an error."""
    if value is None or received_at <= value <= ended_at:
        return value
    if received_at - SKEW_TOLERANCE <= value <= ended_at + SKEW_TOLERANCE:
        return min(max(value, received_at), ended_at)
    raise EventInvalid(name, "must lie between received_at and ended_at")


def _timing(get, engine_timings: tuple[Decimal | None, ...]) -> str:
    """Whose clock the row's timeline is. Omitted: the engine's when the
    event carries any engine timing, else the gateway's window. Named, it
    must agree with what the event carries."""
    queue, ttft, generation = engine_timings
    timed = queue is not None or ttft is not None or generation is not None
    timing = get("timing")
    if timing is None:
        return Timing.ENGINE if timed else Timing.GATEWAY
    if timing == Timing.ENGINE and not timed:
        raise EventInvalid(
            "timing", "'engine' needs the engine's queue_ms, ttft_ms or generation_ms"
        )
    if timing == Timing.GATEWAY and timed:
        raise EventInvalid(
            "timing",
            "'gateway' means the engine reported no timing: omit queue_ms, ttft_ms and "
            "generation_ms, or send 'engine'",
        )
    if timing not in (Timing.ENGINE, Timing.GATEWAY):
        raise EventInvalid("timing", "must be 'engine' or 'gateway'")
    return timing


def _millis(get, name: str) -> Decimal | None:
    value = get(name)
    if value is None:
        return None
    if type(value) is Decimal:
        ms = value
    elif isinstance(value, bool):
        raise EventInvalid(name, "must be a number of milliseconds")
    else:
        try:
            ms = value if isinstance(value, Decimal) else Decimal(str(value))
        except (InvalidOperation, ValueError):
            raise EventInvalid(name, "must be a number of milliseconds") from None
    if not ms.is_finite() or ms < 0 or ms > MAX_MS:
        raise EventInvalid(name, "must be between 0 and 99999999999.999")
    return ms.quantize(MILLISECOND)
