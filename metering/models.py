"""The usage ledger and what is derived from it: device-seconds attributed
per request and window, hourly rollups, and reconciliation against vLLM's
own counters."""

from __future__ import annotations

from decimal import Decimal

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import BrinIndex
from django.db import models
from django.db.models import F, Q

from metering.choices import AttributionPolicy, EventSource, Phase, Timing, WindowStatus
from serving.choices import RequestStatus
from serving.models import Pool, Replica, ServedModel
from tenants.models import Tenant

SECONDS = {"max_digits": 24, "decimal_places": 9}


# A column copied from the ledger into derived rows: no constraint, no index.
COPIED = {"db_constraint": False, "db_index": False}


def ns_to_seconds(ns: int) -> Decimal:
    """Exact: integer nanoseconds as Decimal seconds with 9 places."""
    return Decimal(ns).scaleb(-9)


class UsageEvent(models.Model):
    """One request as a serving tier saw it: who, which model and replica,
    tokens, timings and outcome; or one phase of it (disaggregated serving:
    prefill on one replica, decode on another, a row each). Append-only.
    Unique by (request id, phase) (through UsageKey: the table is
    partitioned by month of `received_at`, and a partitioned table can only
    enforce keys that include the partition key).

    The table is created by migration SQL (declarative partitioning), hence
    `managed = False`; its partitions come from `metering.partitions`."""

    request_id = models.CharField(max_length=128, primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.DO_NOTHING, related_name="+")
    api_key_id = models.BigIntegerField(null=True)
    model = models.CharField(max_length=200, help_text="The name the client called.")
    served_model = models.ForeignKey(
        ServedModel, null=True, on_delete=models.DO_NOTHING, related_name="+"
    )
    replica = models.ForeignKey(Replica, null=True, on_delete=models.DO_NOTHING, related_name="+")
    pool = models.ForeignKey(Pool, null=True, on_delete=models.DO_NOTHING, related_name="+")
    priority = models.IntegerField(default=0)
    stream = models.BooleanField(default=False)
    prompt_tokens = models.IntegerField(default=0)
    cached_tokens = models.IntegerField(default=0)
    completion_tokens = models.IntegerField(default=0)
    received_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True)
    first_token_at = models.DateTimeField(null=True)
    ended_at = models.DateTimeField()
    queue_ms = models.DecimalField(max_digits=14, decimal_places=3, null=True)  # vLLM's queue
    gateway_queue_ms = models.DecimalField(
        max_digits=14,
        decimal_places=3,
        null=True,
        help_text="In the gateway's queue before dispatch (null: not measured).",
    )
    ttft_ms = models.DecimalField(max_digits=14, decimal_places=3, null=True)
    # From the first token to the last; from scheduling to the last token
    # when ttft_ms is null (an engine that reports its inference time whole).
    generation_ms = models.DecimalField(max_digits=14, decimal_places=3, null=True)
    phase = models.CharField(max_length=8, choices=Phase.choices, default=Phase.WHOLE)
    timing = models.CharField(
        max_length=8,
        choices=Timing.choices,
        default=Timing.GATEWAY,
        help_text="Whose clock the timeline is: the engine's, or the gateway's window.",
    )
    status = models.CharField(max_length=16, choices=RequestStatus.choices)
    http_status = models.SmallIntegerField()
    error = models.CharField(max_length=300, blank=True, default="")
    source = models.CharField(max_length=16, choices=EventSource.choices)
    synthetic = models.BooleanField(default=False, help_text="Made by the history generator.")
    ingested_at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = "metering_usageevent"

    def __str__(self) -> str:
        return self.request_id


class UsageKey(models.Model):
    """The ledger's idempotency index: one row per (request id, phase) ever
    recorded, across all partitions (the table's key is both columns:
    migration 0005)."""

    request_id = models.CharField(max_length=128, primary_key=True)
    phase = models.CharField(max_length=8, choices=Phase.choices, default=Phase.WHOLE)
    received_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.request_id


class AttributionWindow(models.Model):
    """One replica over [start, end): its capacity (GPUs x length), the
    device-seconds attributed to requests and the idle rest. Pending when
    usage for it arrived after (or before) it was last computed."""

    replica = models.ForeignKey(Replica, on_delete=models.PROTECT, related_name="windows")
    start = models.DateTimeField()
    end = models.DateTimeField()
    status = models.CharField(
        max_length=16, choices=WindowStatus.choices, default=WindowStatus.PENDING
    )
    policy = models.CharField(max_length=16, choices=AttributionPolicy.choices, blank=True)
    # The replica's GPUs when computed, in GPU units (serving.gpu_shares: a
    # whole GPU is GPU_UNITS, a MIG instance or a time-sliced share less).
    gpu_units = models.PositiveIntegerField(default=0)
    # Device-nanoseconds, integers: capacity = attributed + idle exactly.
    capacity_ns = models.BigIntegerField(default=0)
    attributed_ns = models.BigIntegerField(default=0)
    idle_ns = models.BigIntegerField(default=0)
    requests = models.PositiveIntegerField(default=0)
    marked_at = models.DateTimeField(help_text="When usage last made it pending.")
    computed_at = models.DateTimeField(null=True)

    class Meta:
        ordering = ["-start", "replica"]
        constraints = [
            models.UniqueConstraint(fields=["replica", "start"], name="window_unique"),
            models.CheckConstraint(condition=Q(end__gt=F("start")), name="window_end_after"),
            models.CheckConstraint(
                condition=Q(status__in=WindowStatus.values), name="window_status_valid"
            ),
        ]
        indexes = [models.Index(fields=["status", "start"], name="window_status_start")]

    def __str__(self) -> str:
        return f"{self.replica_id} @ {self.start:%Y-%m-%d %H:%M}"

    @property
    def capacity_seconds(self) -> Decimal:
        return ns_to_seconds(self.capacity_ns)

    @property
    def attributed_seconds(self) -> Decimal:
        return ns_to_seconds(self.attributed_ns)

    @property
    def idle_seconds(self) -> Decimal:
        return ns_to_seconds(self.idle_ns)


class AttributionShare(models.Model):
    """The device-seconds a window gave one tenant's requests for one model
    in one pool at one priority: what rollups read. Replaced whole when its
    window is recomputed. The columns copied from the (validated) ledger
    carry no foreign-key constraints: derived rows, written in bulk."""

    window = models.ForeignKey(AttributionWindow, on_delete=models.CASCADE, related_name="shares")
    tenant = models.ForeignKey(Tenant, on_delete=models.DO_NOTHING, related_name="+", **COPIED)
    served_model = models.ForeignKey(
        ServedModel, null=True, on_delete=models.DO_NOTHING, related_name="+", **COPIED
    )
    pool = models.ForeignKey(
        Pool, null=True, on_delete=models.DO_NOTHING, related_name="+", **COPIED
    )
    priority = models.IntegerField(default=0)
    requests = models.PositiveIntegerField()
    device_ns = models.BigIntegerField(help_text="Device-nanoseconds.")

    def __str__(self) -> str:
        return f"window {self.window_id}, tenant {self.tenant_id}: {self.device_seconds} device-s"

    @property
    def device_seconds(self) -> Decimal:
        return ns_to_seconds(self.device_ns)


class RequestShares(models.Model):
    """Every request's device-nanoseconds in one window, as two parallel
    arrays (a row per window rather than per request: a day of a busy fleet
    is millions of requests). A request that spans windows appears in each.
    Read them through metering.selectors.requests.request_device_seconds."""

    window = models.OneToOneField(
        AttributionWindow, on_delete=models.CASCADE, related_name="request_shares"
    )
    request_ids = ArrayField(models.CharField(max_length=128))
    device_ns = ArrayField(models.BigIntegerField())

    def __str__(self) -> str:
        return f"window {self.window_id}: {len(self.request_ids)} requests"

    def as_seconds(self) -> dict[str, Decimal]:
        return {
            r: ns_to_seconds(ns) for r, ns in zip(self.request_ids, self.device_ns, strict=True)
        }


class UsageRollup(models.Model):
    """One hour of one tenant's usage of one model on one replica and pool at
    one priority: what reports, exports, dashboards and rating read."""

    hour = models.DateTimeField()
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    served_model = models.ForeignKey(
        ServedModel, null=True, on_delete=models.PROTECT, related_name="+"
    )
    pool = models.ForeignKey(Pool, null=True, on_delete=models.PROTECT, related_name="+")
    replica = models.ForeignKey(Replica, null=True, on_delete=models.PROTECT, related_name="+")
    priority = models.IntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    cached_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    requests_ok = models.BigIntegerField(default=0)
    requests_aborted = models.BigIntegerField(default=0)
    requests_error = models.BigIntegerField(default=0)
    requests_rejected = models.BigIntegerField(default=0)
    device_seconds = models.DecimalField(**SECONDS, default=0)
    # Time in the gateway's queue: the sum over the requests that recorded
    # one, how many did (the mean's denominator) and how many of them waited
    # at all. Defaulted in the database too, for bulk writers that name no
    # such columns.
    gateway_queue_ms_sum = models.DecimalField(
        max_digits=24, decimal_places=3, default=0, db_default=0
    )
    gateway_queue_requests = models.BigIntegerField(default=0, db_default=0)
    gateway_queued_requests = models.BigIntegerField(default=0, db_default=0)
    # Served requests whose timeline is the gateway's window (an engine that
    # reports no per-request timing): their device-seconds are estimated.
    requests_gateway_timed = models.BigIntegerField(default=0, db_default=0)
    synthetic = models.BooleanField(default=False)

    class Meta:
        ordering = ["-hour"]
        constraints = [
            models.UniqueConstraint(
                fields=["hour", "tenant", "served_model", "pool", "replica", "priority"],
                name="rollup_unique",
                nulls_distinct=False,
            )
        ]
        indexes = [
            models.Index(fields=["tenant", "hour"], name="rollup_tenant_hour"),
            models.Index(fields=["hour"], name="rollup_hour"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.hour:%Y-%m-%d %H:00}"


class ReplicaLoadHour(models.Model):
    """One hour of one replica's load and latency, from the requests it was
    sent in that hour: served requests and tokens, busy request-seconds
    (the sum of their times on the replica: over 3600, the mean number in
    flight), and the p95 of time to first token and inter-token latency as
    SLO compliance measures them (metering.selectors.slo). Rebuilt with the
    hour's rollups; kept when retention sheds the raw requests, so capacity
    at an SLO (planning.capacity) is read from months of hours."""

    hour = models.DateTimeField()
    replica = models.ForeignKey(Replica, on_delete=models.PROTECT, related_name="+")
    served_model = models.ForeignKey(
        ServedModel, null=True, on_delete=models.PROTECT, related_name="+"
    )
    pool = models.ForeignKey(Pool, null=True, on_delete=models.PROTECT, related_name="+")
    requests = models.BigIntegerField(default=0)
    tokens = models.BigIntegerField(default=0)
    busy_seconds = models.DecimalField(max_digits=24, decimal_places=3, default=0)
    ttft_p95_ms = models.DecimalField(max_digits=14, decimal_places=3, null=True)
    itl_p95_ms = models.DecimalField(max_digits=14, decimal_places=3, null=True)
    synthetic = models.BooleanField(default=False)

    class Meta:
        ordering = ["-hour"]
        constraints = [models.UniqueConstraint(fields=["hour", "replica"], name="load_hour_unique")]
        indexes = [models.Index(fields=["hour"], name="load_hour_hour")]

    def __str__(self) -> str:
        return f"{self.replica_id} {self.hour:%Y-%m-%d %H:00}"


class EnergyHour(models.Model):
    """One hour of the fleet's energy at the wall (PUE included) and its
    emissions at each site's grid intensity, as the booked allocation
    computes them (billing.costs.energy): a tenant's use of a model in a
    pool (the GPUs' draw while serving it), or a pool's idle draw (no
    tenant; a spare GPU's, no pool either). An hour's rows add up to the
    fleet's energy in it."""

    hour = models.DateTimeField()
    pool = models.ForeignKey(
        Pool, null=True, **COPIED, on_delete=models.DO_NOTHING, related_name="+"
    )
    tenant = models.ForeignKey(
        Tenant, null=True, **COPIED, on_delete=models.DO_NOTHING, related_name="+"
    )
    served_model = models.ForeignKey(
        ServedModel, null=True, **COPIED, on_delete=models.DO_NOTHING, related_name="+"
    )
    kwh = models.DecimalField(max_digits=20, decimal_places=6)
    co2e_g = models.DecimalField(max_digits=20, decimal_places=3)

    class Meta:
        ordering = ["hour"]
        # Written with every booked allocation (a row per allocation row):
        # rows arrive in hour order, so a BRIN index serves reads by period
        # (a tenant's filtered within it) at almost no cost per write, where
        # B-trees on (tenant, hour) and hour doubled the allocation's writing.
        indexes = [BrinIndex(fields=["hour"], name="energy_hour_brin")]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H:00} {self.tenant_id or 'idle'}: {self.kwh} kWh"


class UsageDay(models.Model):
    """One UTC day of one tenant's usage of one model: the sums of its
    hourly rollups (those with a model), kept by the database itself.
    Triggers on metering_usagerollup (migration 0007) add and subtract
    every row written, changed or deleted, in the statement that does it,
    whoever writes: the days always equal their hours. Rating reads a
    period's whole days here, a 24th of the rows of its hours."""

    day = models.DateTimeField()  # midnight UTC
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    served_model = models.ForeignKey(ServedModel, on_delete=models.PROTECT, related_name="+")
    prompt_tokens = models.BigIntegerField(default=0)
    cached_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    device_seconds = models.DecimalField(**SECONDS, default=0)
    # How many hourly rows are summed; a day left with none is deleted.
    rollup_rows = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["day", "tenant", "served_model"], name="usageday_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.day:%Y-%m-%d}"


class DirtyHour(models.Model):
    """An hour whose rollups must be recomputed (usage arrived for it)."""

    hour = models.DateTimeField(primary_key=True)
    marked_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H:00}"


class ReconciliationGap(models.Model):
    """Per replica and window: tokens vLLM says it processed (deltas of its
    own counters, aborted requests included) against tokens metered to
    tenants. A positive gap is served but unbilled (revenue leakage)."""

    replica = models.ForeignKey(Replica, on_delete=models.PROTECT, related_name="+")
    start = models.DateTimeField()
    end = models.DateTimeField()
    vllm_prompt_tokens = models.BigIntegerField()
    vllm_generation_tokens = models.BigIntegerField()
    metered_prompt_tokens = models.BigIntegerField()
    metered_generation_tokens = models.BigIntegerField()
    samples = models.PositiveIntegerField()
    computed_at = models.DateTimeField()

    class Meta:
        ordering = ["-start", "replica"]
        constraints = [
            models.UniqueConstraint(fields=["replica", "start", "end"], name="recon_unique")
        ]

    def __str__(self) -> str:
        return f"{self.replica_id} @ {self.start:%Y-%m-%d %H:%M}"

    @property
    def prompt_gap(self) -> int:
        return self.vllm_prompt_tokens - self.metered_prompt_tokens

    @property
    def generation_gap(self) -> int:
        return self.vllm_generation_tokens - self.metered_generation_tokens


class UsageArchive(models.Model):
    """One month of the raw ledger archived (metering.archive): its
    partition exported to a Parquet file, read back and checked against
    the database, then dropped. Kept forever: what was archived, where,
    and the numbers that prove the file whole."""

    month = models.DateTimeField(unique=True, help_text="The first instant of the UTC month.")
    partition = models.CharField(max_length=100)
    url = models.CharField(max_length=1000, help_text="Where the Parquet file is.")
    rows = models.BigIntegerField()
    prompt_tokens = models.BigIntegerField()
    cached_tokens = models.BigIntegerField()
    completion_tokens = models.BigIntegerField()
    bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    exported_at = models.DateTimeField()
    verified_at = models.DateTimeField(null=True)
    keys_pruned = models.BigIntegerField(default=0)
    dropped_at = models.DateTimeField(null=True, help_text="When the partition was dropped.")

    class Meta:
        ordering = ["-month"]

    def __str__(self) -> str:
        return f"{self.month:%Y-%m}: {self.rows} events in {self.url}"
