"""Who is calling the gateway: a live API key with the inference scope and
its tenant's policy (CallerCache), and the tenant's spend terms
(TermsCache), cached in-process so the hot path does not hit the database
on every request: keys for a few seconds, terms (costly to read) longer. A
change to any of them is told to the gateway at once (gateway.changes),
which forgets the tenant's entries; the TTL bounds how stale an entry can
be when that notice is lost."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db import Error as DatabaseError  # InterfaceError too
from django.utils import timezone

from billing.spend.terms import SpendTerms, spend_terms
from core.outages import database_outage_report
from gateway.errors import Refused
from gateway.orm import orm
from tenants.choices import VLLM_PRIORITY, Scope
from tenants.errors import AuthenticationError, TenantSuspendedError
from tenants.models import Tenant

logger = logging.getLogger(__name__)


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
    # When the key expires (epoch seconds; None: never): the cache keeps
    # the caller no longer than that.
    expires_at: float | None = None


STALE_RETRY = 1.0  # seconds between tries of a database that is away


class DatabaseUnavailable(Exception):
    """A load failed on the database (not on what it read)."""


class CallerRefused(Exception):
    """Who is calling, or under which terms, decides that the request may
    not run: `refused` is the answer."""

    def __init__(self, status: int, code: str, message: str, *, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.refused = Refused(status, code, message, retry_after=retry_after)


def cache_salt_for(tenant_id: int) -> str:
    """A per-tenant salt for vLLM's prefix cache: stable, and not guessable
    from the tenant id without the server's pepper."""
    pepper = settings.API_KEY_PEPPER.encode()
    return hmac.new(pepper, f"cache-salt:{tenant_id}".encode(), hashlib.sha256).hexdigest()[:32]


def caller_load(raw_key: str) -> Caller:
    """The caller for `raw_key`, from the database (sync: gateway.orm runs it)."""
    from tenants.services import api_key_authenticate

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
        expires_at=key.expires_at.timestamp() if key.expires_at is not None else None,
    )


class LoadingCache:
    """key -> a value (or a refusal) loaded in a thread, shared by the
    requests that ask for it at once, and kept `ttl_seconds`. Past half its
    TTL an entry still in use is reloaded in the background while it goes
    on serving, so a busy key never waits on the database; past its TTL a
    request waits for the reload. Refusals are cached too, so a client
    hammering with a bad key costs one lookup per TTL.

    `forget(tenant)` drops what is cached of a tenant (and every refusal,
    whose tenant is not kept): its next request reloads, and a load that was
    in flight when it was forgotten is used once but not kept.

    The database away: an entry past its TTL goes on serving, up to
    `stale_seconds` past it, and the database is tried again a second
    later (one request waits for that try, the others are served what was
    known). A tenant the gateway had seen keeps being served through an
    outage; one it had not is a 503 database_unavailable."""

    def __init__(
        self,
        *,
        ttl_seconds: float,
        stale_seconds: float = 3600.0,
        max_entries: int = 100_000,
        max_refusals: int = 10_000,
    ) -> None:
        self._ttl = ttl_seconds
        self._stale = stale_seconds
        self._max = max_entries
        self._max_refusals = max_refusals
        # key -> (refresh after, expires, value, served stale until), monotonic
        # seconds: what was found (a live tenant's key, its terms). Full, the
        # oldest entry goes, one at a time: never every live tenant at once.
        self._entries: dict = {}
        # Refusals apart, by a digest of the key (a junk key is not kept
        # whole) and bounded on their own: a flood of keys that do not exist
        # pushes out only other refusals, never a live tenant's entry.
        self._refusals: dict = {}
        self._loading: dict = {}
        self._forgotten: list[tuple[int, int | None]] = []  # (sequence, tenant or None: all)
        self._sequence = 0
        self._refreshing: set[asyncio.Task] = set()

    def load(self, key):
        """The value for `key` (sync: gateway.orm runs it); may raise CallerRefused."""
        raise NotImplementedError

    def tenant_of(self, key, value) -> int | None:
        raise NotImplementedError

    def expires_in(self, value) -> float:
        """How long `value` may be kept (seconds)."""
        return self._ttl

    async def lookup(self, key):
        now = time.monotonic()
        entry = self._entries.get(key) or self._refusals.get(_digest(key))
        if entry is None or entry[1] <= now:
            try:
                result = await self._load(key)
            except DatabaseUnavailable:
                if entry is None or entry[3] <= now:
                    raise CallerRefused(
                        503,
                        "database_unavailable",
                        "the gateway could not read its database: try again shortly",
                        retry_after=1,
                    ) from None
                result = entry[2]  # what was known, while the database is away
                if self._entries.get(key) is entry:
                    self._entries[key] = (now + STALE_RETRY, now + STALE_RETRY, *entry[2:])
                elif self._refusals.get(_digest(key)) is entry:
                    self._refusals[_digest(key)] = (
                        now + STALE_RETRY,
                        now + STALE_RETRY,
                        *entry[2:],
                    )
        else:
            if entry[0] <= now and key not in self._loading:
                self._refresh(key)
            result = entry[2]
        if isinstance(result, Refused):
            # A fresh exception each time: re-raising a cached instance would
            # chain one more traceback (and its frames) onto it per request.
            raise CallerRefused(result.status, result.code, result.message)
        return result

    def forget(self, tenant_id: int | None = None) -> None:
        self._sequence += 1
        self._forgotten.append((self._sequence, tenant_id))
        del self._forgotten[:-1000]
        self._refusals.clear()  # a refusal's tenant is not kept: any change may lift it
        if tenant_id is None:
            self._entries.clear()
            return
        for key, (_, _, result, _) in list(self._entries.items()):
            if self._drops(key, result, tenant_id):
                del self._entries[key]

    def expire(self) -> None:
        """Every entry read again before its next use, but still known: what
        a lost change notification may have changed (the listener back after
        a database outage). Unlike `forget()` the entries stay, so the
        tenants the gateway knows are still told from strangers (their keys
        spend no address's refusal budget) and, the database away again,
        still served what was known; a load in flight is used once, not kept."""
        self._sequence += 1
        self._forgotten.append((self._sequence, None))
        del self._forgotten[:-1000]
        self._refusals.clear()
        now = time.monotonic()
        for key, (_, _, result, stale_until) in list(self._entries.items()):
            self._entries[key] = (now, now, result, stale_until)

    def _drops(self, key, result, tenant_id: int | None) -> bool:
        return (
            tenant_id is None
            or isinstance(result, Refused)
            or self.tenant_of(key, result) == tenant_id
        )

    def _refresh(self, key) -> None:
        async def refresh():
            try:
                await self._load(key)
            except Exception:  # the entry serves until it expires; then a request waits
                logger.warning("could not refresh a cached entry", exc_info=True)

        task = asyncio.get_running_loop().create_task(refresh())
        self._refreshing.add(task)  # a strong reference while it runs
        task.add_done_callback(self._refreshing.discard)

    async def _load(self, key):
        # One database lookup per key at a time, however many requests wait on it.
        pending = self._loading.get(key)
        if pending is not None:
            return await pending
        future = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        sequence = self._sequence
        try:
            try:
                result = await orm(self.load, key=key)
            except CallerRefused as refused:
                result = refused.refused
            except DatabaseError as exc:  # not kept: the next request reads again
                # An outage is one line per episode (core.outages), not one per key.
                if not database_outage_report(exc, doing="gateway reading a key", log=logger):
                    logger.warning("gateway: the database could not be read: %s", exc)
                raise DatabaseUnavailable from None
            future.set_result(result)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when none waits
            raise
        finally:
            del self._loading[key]
        self._keep(key, result, sequence)
        return result

    def _keep(self, key, result, sequence: int) -> None:
        for seen, tenant in reversed(self._forgotten):
            if seen <= sequence:
                break
            if self._drops(key, result, tenant):
                return  # read before a change to it: used once, not kept
        now, keep = time.monotonic(), self.expires_in(result)
        entry = (now + keep / 2, now + keep, result, now + keep + self._stale)
        if isinstance(result, Refused):
            _bounded_put(self._refusals, _digest(key), entry, self._max_refusals)
        else:
            _bounded_put(self._entries, key, entry, self._max)


def _digest(key) -> object:
    """What a refusal is kept under: a string key's 16-byte digest."""
    if isinstance(key, str):
        return hashlib.blake2b(key.encode(), digest_size=16).digest()
    return key


def _bounded_put(entries: dict, key, entry, limit: int) -> None:
    """`entries[key] = entry`, the oldest entries dropped first to stay
    within `limit` (a dict keeps insertion order: put again, an entry is
    the newest)."""
    entries.pop(key, None)
    while len(entries) >= limit:
        del entries[next(iter(entries))]
    entries[key] = entry


class RefusalBucket:
    """Per client address, how many unknown keys it may have looked up: a
    token bucket (`per_second`, up to `burst`), spent by each lookup that
    was refused. An address whose bucket is empty is refused without a lookup
    (issue 60: every key-shaped junk key cost a database query). Bounded:
    the `addresses` most recently refused are remembered."""

    def __init__(self, *, per_second: float = 20.0, burst: float = 200.0, addresses=10_000):
        self.per_second, self.burst, self.addresses = per_second, burst, addresses
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, at)

    def exhausted(self, address: str) -> bool:
        tokens, at = self._buckets.get(address, (self.burst, 0.0))
        return min(self.burst, tokens + (time.monotonic() - at) * self.per_second) < 1

    def spend(self, address: str) -> None:
        now = time.monotonic()
        tokens, at = self._buckets.get(address, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.per_second) - 1
        _bounded_put(self._buckets, address, (tokens, now), self.addresses)


class CallerCache(LoadingCache):
    """raw API key -> its Caller."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.used_at: dict[int, float] = {}  # api key id -> last use (epoch seconds)
        self.refusals = RefusalBucket()

    def known(self, key: str) -> bool:
        """Whether `key` is a live entry (a known tenant's, served from memory)."""
        return key in self._entries

    def load(self, key: str) -> Caller:
        return caller_load(key)

    def expires_in(self, value) -> float:
        """The TTL, or less for a key that expires sooner (then read again,
        and refused)."""
        if not isinstance(value, Caller) or value.expires_at is None:
            return self._ttl  # a refusal, or a key that never expires
        return max(0.0, min(self._ttl, value.expires_at - time.time()))

    def tenant_of(self, key: str, value: Caller) -> int:
        return value.tenant_id

    async def get(self, raw_key: str) -> Caller:
        caller = await self.lookup(raw_key)
        self.used_at[caller.api_key_id] = time.time()
        return caller

    async def used_write(self) -> None:
        """When each key was last used, written (a few keys at a time, not
        a write per request); a failure is logged, not retried."""
        used, self.used_at = self.used_at, {}
        if not used:
            return
        from tenants.services import api_keys_mark_used

        stamps = {k: datetime.fromtimestamp(t, tz=UTC) for k, t in used.items()}
        try:
            await orm(api_keys_mark_used, used_at_by_key=stamps)
        except Exception:
            logger.exception("could not record API key use")


class TermsCache(LoadingCache):
    """tenant id -> its spend terms (None: nothing to hold it to). Terms are
    costly to read (its period's spend rated from the ledger) and change
    only when told (gateway.changes: a budget, credit, a price, an
    invoice), so they are kept longer than keys, and never past the end of
    the period they are for."""

    def load(self, key: int) -> SpendTerms | None:
        tenant = Tenant.objects.select_related("policy").get(pk=key)
        return spend_terms(tenant=tenant, now=timezone.now())

    def tenant_of(self, key: int, value) -> int:
        return key

    def expires_in(self, value: SpendTerms | None) -> float:
        if value is None:
            return self._ttl
        left = (value.period_end - timezone.now()).total_seconds()
        return max(0.0, min(self._ttl, left))

    async def get(self, tenant_id: int) -> SpendTerms | None:
        return await self.lookup(tenant_id)
