"""Shapes of the metering API. Usage events are parsed and validated by
metering.validation (one fast pass, per-item errors); the serializers here
describe them for the OpenAPI schema."""

from rest_framework import serializers

from core.api_query import QueryIn, range_help, range_validated
from core.api_time import SupportedDateTimeField
from metering.choices import Phase, Timing
from metering.validation import MAX_TOKENS
from serving.choices import RequestStatus


class UsageEventIn(serializers.Serializer):
    """One completed request, as another serving tier reports it."""

    request_id = serializers.CharField(max_length=128, help_text="Unique; re-sending is a no-op.")
    tenant = serializers.SlugField(required=False, help_text="Tenant slug (or tenant_id).")
    tenant_id = serializers.IntegerField(required=False)
    model = serializers.CharField(help_text="Served model or the tenant's LoRA adapter name.")
    replica = serializers.CharField(required=False, help_text="Replica name (or replica_id).")
    replica_id = serializers.IntegerField(required=False)
    pool_id = serializers.IntegerField(required=False, help_text="Default: the replica's pool.")
    priority = serializers.IntegerField(required=False, default=0)
    stream = serializers.BooleanField(required=False, default=False)
    prompt_tokens = serializers.IntegerField(min_value=0, max_value=MAX_TOKENS, default=0)
    cached_tokens = serializers.IntegerField(min_value=0, max_value=MAX_TOKENS, default=0)
    completion_tokens = serializers.IntegerField(min_value=0, max_value=MAX_TOKENS, default=0)
    received_at = SupportedDateTimeField(help_text="ISO 8601 with a UTC offset.")
    sent_at = SupportedDateTimeField(required=False)
    first_token_at = SupportedDateTimeField(required=False)
    ended_at = SupportedDateTimeField()
    queue_ms = serializers.DecimalField(max_digits=14, decimal_places=3, required=False)
    ttft_ms = serializers.DecimalField(max_digits=14, decimal_places=3, required=False)
    generation_ms = serializers.DecimalField(
        max_digits=14,
        decimal_places=3,
        required=False,
        help_text=(
            "From the first token to the last; with no ttft_ms, from scheduling to the last "
            "token (an engine that reports its inference time whole, as TGI does)."
        ),
    )
    timing = serializers.ChoiceField(
        choices=Timing.choices,
        required=False,
        help_text=(
            "engine: queue_ms, ttft_ms, generation_ms are the engine's own per-request timings. "
            "gateway: the engine reported none, and the timeline is the reporting tier's window "
            "from sent_at to ended_at (attributed device-seconds are then an estimate). "
            "Omitted: engine when any engine timing is sent, else gateway."
        ),
    )
    phase = serializers.ChoiceField(
        choices=Phase.choices,
        required=False,
        help_text=(
            "A disaggregated request (prefill on one replica, decode on another, as NVIDIA "
            "Dynamo or vLLM's disaggregated serving run it) is reported as two events under "
            "one request_id: 'prefill' on its prefill replica (the prompt, and the one token it "
            "made) and 'decode' on its decode replica (the output), each with that replica's "
            "own usage and timing; billed once (the prefill's prompt, the decode's output). "
            "Omitted: 'whole'. A phase must match its replica's role."
        ),
    )
    gateway_queue_ms = serializers.DecimalField(
        max_digits=14,
        decimal_places=3,
        min_value=0,
        required=False,
        allow_null=True,
        help_text=(
            "Milliseconds the request waited in the gateway's own queue before it was sent "
            "to a replica (queue_ms is the replica's queue). Omitted or null: not measured."
        ),
    )
    status = serializers.ChoiceField(choices=RequestStatus.choices)
    http_status = serializers.IntegerField(required=False)
    error = serializers.CharField(required=False, allow_blank=True)


class UsageBatchIn(serializers.Serializer):
    events = UsageEventIn(many=True)


class UsageItemResultOut(serializers.Serializer):
    index = serializers.IntegerField()
    request_id = serializers.CharField(allow_null=True)
    status = serializers.ChoiceField(
        choices=["accepted", "duplicate", "rejected", "not_written"],
        help_text="not_written: valid, but the batch was refused for another event.",
    )
    field = serializers.CharField(required=False)
    reason = serializers.CharField(required=False)


class UsageQueuedResultOut(serializers.Serializer):
    index = serializers.IntegerField()
    request_id = serializers.CharField()
    status = serializers.ChoiceField(choices=["queued"])


class UsageBatchQueuedOut(serializers.Serializer):
    """The scaled path's answer (USAGE_LOG_URL set): the batch is on the
    usage log; duplicates are kept once downstream."""

    queued = serializers.IntegerField()
    results = UsageQueuedResultOut(many=True)


class UsageBatchOut(serializers.Serializer):
    accepted = serializers.IntegerField()
    duplicates = serializers.IntegerField()
    results = UsageItemResultOut(many=True)


class UsageQueryIn(QueryIn):
    """Parameters of the usage export."""

    start = SupportedDateTimeField(
        input_formats=["iso-8601", "%Y-%m-%d"], help_text="Inclusive; a date or ISO timestamp."
    )
    end = SupportedDateTimeField(
        input_formats=["iso-8601", "%Y-%m-%d"],
        help_text=range_help("93 days (group_by=hour), 1,100 (day) or 3,700 (month)"),
    )
    group_by = serializers.ChoiceField(choices=["hour", "day", "month"], default="day")
    model = serializers.CharField(required=False, max_length=200)
    tenant = serializers.SlugField(
        required=False, help_text="Finance staff: one tenant. Tenants: only their own slug."
    )
    limit = serializers.IntegerField(min_value=1, max_value=5000, default=500)
    cursor = serializers.CharField(required=False, max_length=200)
    format = serializers.ChoiceField(choices=["json", "csv"], default="json")

    def validate(self, attrs):
        from metering.selectors.usage import MAX_RANGE

        group_by = attrs["group_by"]
        return range_validated(attrs, longest=MAX_RANGE[group_by], why=f" with group_by={group_by}")


class UsageRowOut(serializers.Serializer):
    period_start = serializers.DateTimeField(help_text="ISO 8601 in UTC, in JSON and CSV alike.")
    tenant = serializers.CharField()
    model = serializers.CharField(
        help_text='"(unknown)" for requests that named no model served here (refused '
        "before reaching a replica: a malformed body, a missing or unknown model)."
    )
    prompt_tokens = serializers.IntegerField()
    cached_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    requests = serializers.IntegerField()
    requests_ok = serializers.IntegerField()
    requests_aborted = serializers.IntegerField()
    requests_error = serializers.IntegerField()
    requests_rejected = serializers.IntegerField()
    device_seconds = serializers.DecimalField(max_digits=24, decimal_places=9)
    gateway_queue_ms_sum = serializers.DecimalField(
        max_digits=24,
        decimal_places=3,
        help_text="Milliseconds waited in the gateway's queue, summed over gateway_queue_requests.",
    )
    gateway_queue_ms_mean = serializers.DecimalField(
        max_digits=24,
        decimal_places=3,
        allow_null=True,
        help_text="gateway_queue_ms_sum / gateway_queue_requests; null when none recorded it.",
    )
    gateway_queue_requests = serializers.IntegerField(
        help_text="Requests that recorded a gateway queue time (others predate it or came "
        "from another serving tier)."
    )
    gateway_queued_requests = serializers.IntegerField(
        help_text="Of those, the requests that waited in the gateway's queue at all."
    )
    energy_kwh = serializers.DecimalField(
        max_digits=20,
        decimal_places=6,
        allow_null=True,
        help_text="The GPUs' draw at the wall (PUE included) while serving this usage; "
        "null until its hours are allocated.",
    )
    co2e_g = serializers.DecimalField(
        max_digits=20,
        decimal_places=3,
        allow_null=True,
        help_text="Grams of CO2e of that energy at each site's grid intensity; null likewise.",
    )


class UsagePageOut(serializers.Serializer):
    results = UsageRowOut(many=True)
    next_cursor = serializers.CharField(allow_null=True)
