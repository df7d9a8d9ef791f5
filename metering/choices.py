"""Enumerations of the usage ledger and attribution."""

from django.db import models


class EventSource(models.TextChoices):
    """Which serving tier reported a usage event."""

    GATEWAY = "gateway", "This platform's gateway"
    API = "api", "Batch ingestion API (another serving tier)"


class Timing(models.TextChoices):
    """Where a ledger row's timeline comes from: the engine's own
    per-request timings (queue, first token, generation), or, for an engine
    that reports token counts only, the gateway's window from sending the
    request to its last byte (an estimate of the request's residence)."""

    ENGINE = "engine", "Measured by the engine"
    GATEWAY = "gateway", "The gateway's window (sent to last byte)"


class Phase(models.TextChoices):
    """Which part of a request a ledger row is. Disaggregated serving runs
    a request's prefill on one replica and its decode on another: a row for
    each, under one request id."""

    WHOLE = "whole", "Whole request"
    PREFILL = "prefill", "Prefill phase"
    DECODE = "decode", "Decode phase"


class AttributionPolicy(models.TextChoices):
    """How a slice of a replica's device time is split among the requests
    resident in it (docs/architecture.md, Attribution)."""

    EQUAL = "equal", "Equal shares (processor sharing)"
    ROOFLINE = "roofline", "Roofline: weight reads shared, KV cache per request"


class WindowStatus(models.TextChoices):
    PENDING = "pending", "Pending (new or late usage)"
    DONE = "done", "Attributed"
