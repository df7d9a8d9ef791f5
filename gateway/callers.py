"""Who is calling the gateway: a live API key with the inference scope,
with its tenant's policy, cached in-process for a few seconds so the hot
path does not hit the database on every request. A revoked key stops
working within the cache's TTL."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from billing.pricing.spend_terms import SpendTerms, spend_terms
from tenants.choices import VLLM_PRIORITY, Scope
from tenants.errors import AuthenticationError, TenantSuspendedError


@dataclass(frozen=True)
class Limits:
    """Admission limits (None: unlimited) and the tenant's place in the fair
    queue: its weight, how long a request may wait, how many may wait."""

    max_concurrent_requests: int | None
    requests_per_minute: int | None
    tokens_per_minute: int | None
    max_inflight_tokens: int | None
    fair_share_weight: int = 1
    queue_timeout_ms: int = 5000
    max_queued_requests: int = 100


@dataclass(frozen=True)
class Caller:
    tenant_id: int
    tenant_slug: str
    api_key_id: int
    priority: int
    cache_salt: str
    limits: Limits
    spend: SpendTerms | None = None  # a budget to hold at admission (issue 18)


class CallerRefused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def cache_salt_for(tenant_id: int) -> str:
    """A per-tenant salt for vLLM's prefix cache: stable, and not guessable
    from the tenant id without the server's pepper."""
    pepper = settings.API_KEY_PEPPER.encode()
    return hmac.new(pepper, f"cache-salt:{tenant_id}".encode(), hashlib.sha256).hexdigest()[:32]


def caller_load(raw_key: str) -> Caller:
    """The caller for `raw_key`, from the database (sync; run in a thread)."""
    from django.db import close_old_connections

    from tenants.services import api_key_authenticate

    close_old_connections()
    try:
        key = api_key_authenticate(raw_key=raw_key)
    except AuthenticationError as exc:
        raise CallerRefused(401, "invalid_api_key", str(exc)) from None
    except TenantSuspendedError as exc:
        raise CallerRefused(403, "tenant_suspended", str(exc)) from None
    if Scope.INFERENCE not in key.scopes:
        raise CallerRefused(403, "insufficient_scope", "this API key lacks the 'inference' scope")
    policy = key.tenant.policy
    if policy.budget_blocked_at is not None:
        raise CallerRefused(402, "budget_exceeded", policy.budget_block_message)
    return Caller(
        tenant_id=key.tenant_id,
        tenant_slug=key.tenant.slug,
        api_key_id=key.pk,
        priority=VLLM_PRIORITY[policy.priority_class],
        cache_salt=cache_salt_for(key.tenant_id),
        limits=Limits(
            max_concurrent_requests=policy.max_concurrent_requests,
            requests_per_minute=policy.requests_per_minute,
            tokens_per_minute=policy.tokens_per_minute,
            max_inflight_tokens=policy.max_inflight_tokens,
            fair_share_weight=policy.fair_share_weight,
            queue_timeout_ms=policy.queue_timeout_ms,
            max_queued_requests=policy.max_queued_requests,
        ),
        spend=spend_terms(tenant=key.tenant, now=timezone.now()),
    )


class CallerCache:
    """raw key -> (Caller or refusal, expiry). Refusals are cached too, so a
    client hammering with a bad key costs one lookup per TTL."""

    def __init__(self, *, ttl_seconds: float, max_entries: int = 100_000) -> None:
        self._ttl = ttl_seconds
        self._max = max_entries
        self._entries: dict[str, tuple[float, Caller | CallerRefused]] = {}
        self._loading: dict[str, asyncio.Future] = {}
        self.used_at: dict[int, float] = {}  # api key id -> last use (epoch seconds)

    async def get(self, raw_key: str) -> Caller:
        now = time.monotonic()
        entry = self._entries.get(raw_key)
        if entry is None or entry[0] <= now:
            result = await self._load(raw_key)
            if len(self._entries) >= self._max:
                self._entries.clear()
            self._entries[raw_key] = (time.monotonic() + self._ttl, result)
        else:
            result = entry[1]
        if isinstance(result, CallerRefused):
            # A fresh exception each time: re-raising the cached instance would
            # chain one more traceback (and its frames) onto it per request.
            raise CallerRefused(result.status, result.code, result.message)
        self.used_at[result.api_key_id] = time.time()
        return result

    async def _load(self, raw_key: str) -> Caller | CallerRefused:
        # One database lookup per key at a time, however many requests wait on it.
        pending = self._loading.get(raw_key)
        if pending is not None:
            return await pending
        future = asyncio.get_running_loop().create_future()
        self._loading[raw_key] = future
        try:
            try:
                result: Caller | CallerRefused = await asyncio.to_thread(caller_load, raw_key)
            except CallerRefused as refused:
                result = refused
            future.set_result(result)
            return result
        except BaseException as exc:
            future.set_exception(exc)
            raise
        finally:
            del self._loading[raw_key]
