"""Where a tenant stands against what the gateway holds it to, for people:
the portal, the API. The gateway's own counters are read when they are
shared (Redis), so what shows is what the next request is held to,
reservations of requests in flight included; a single gateway without
Redis keeps them in its memory, and then the ledger's figure shows (it
trails by the metering pipeline's minute or two) and nothing as reserved."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from redis.exceptions import RedisError

from billing.spend.accounts import redis_spend_state
from billing.spend.terms import SpendAccount, spend_terms
from core.redis_clients import limits_redis_url
from tenants.models import Tenant

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Standing:
    kind: str  # budget | prepaid
    currency: str
    limit: Decimal  # the hard budget, or the credit
    spent: Decimal
    reserved: Decimal | None  # None: not visible here (no shared counters)
    live: bool  # spent is the gateway's count (else the ledger's)

    @property
    def left(self) -> Decimal:
        return max(Decimal(0), self.limit - self.spent - (self.reserved or 0))

    @property
    def used_percent(self) -> float:  # ok-float: a bar's width
        if not self.limit:
            return 100.0
        used = (self.spent + (self.reserved or 0)) / self.limit * 100
        return float(min(100, used))  # ok-float: a bar's width


def spend_standing(*, tenant: Tenant, now: datetime) -> list[Standing]:
    terms = spend_terms(tenant=tenant, now=now)
    if terms is None:
        return []
    return [_standing(account, terms.currency) for account in terms.accounts]


def _standing(account: SpendAccount, currency: str) -> Standing:
    state = None
    # What requests in flight hold: unknown without shared counters or when
    # they cannot be read, nothing when no request has used them yet.
    reserved = None
    if limits_redis_url():
        prefix = settings.GATEWAY["REDIS_PREFIX"]
        try:
            state = redis_spend_state(limits_redis_url(), account.key, prefix=prefix)
            reserved = Decimal(0)
        except RedisError:
            logger.warning("spend counters unreachable; showing the ledger's figure")
    if state is None:  # no shared counter, none yet, or unreachable: the ledger's word
        return Standing(
            account.kind, currency, account.limit, account.spent, reserved=reserved, live=False
        )
    return Standing(account.kind, currency, account.limit, state.spent, state.reserved, live=True)
