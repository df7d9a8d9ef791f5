"""Enumerations of the usage ledger and attribution."""

from django.db import models


class EventSource(models.TextChoices):
    """Which serving tier reported a usage event."""

    GATEWAY = "gateway", "This platform's gateway"
    API = "api", "Batch ingestion API (another serving tier)"


class AttributionPolicy(models.TextChoices):
    """How a slice of a replica's device time is split among the requests
    resident in it (docs/architecture.md, Attribution)."""

    EQUAL = "equal", "Equal shares (processor sharing)"
    ROOFLINE = "roofline", "Roofline: weight reads shared, KV cache per request"


class WindowStatus(models.TextChoices):
    PENDING = "pending", "Pending (new or late usage)"
    DONE = "done", "Attributed"
