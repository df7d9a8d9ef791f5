"""Signing per the Standard Webhooks specification (the `standardwebhooks`
library): the headers webhook-id (the event id), webhook-timestamp and
webhook-signature (v1, HMAC-SHA256 over id.timestamp.body)."""

from __future__ import annotations

import base64
import secrets
from datetime import datetime

from standardwebhooks.webhooks import Webhook

SECRET_PREFIX = "whsec_"  # noqa: S105 (the format's prefix, not a secret)


def secret_generate() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def signed_headers(*, secret: str, event_id: str, at: datetime, body: str) -> dict[str, str]:
    return {
        "webhook-id": event_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(secret).sign(event_id, at, body),
        "content-type": "application/json",
        "user-agent": "gpu-ledger-webhooks/1",
    }
