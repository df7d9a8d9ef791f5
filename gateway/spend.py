"""The gateway's hold on a tenant's spend: a request's worst case
reserved on each of its tenant's accounts (billing.spend.accounts) before it
is forwarded, refused with 402 when it does not fit, settled to what it
cost when it ends.

**Tokens.** The worst case: the bounds `gateway.payload` puts on the prompt
(its bytes, and the context less max_tokens), the output (max_tokens, or
the context) and the choices (n, best_of), priced by billing's rating code
where the period's volume tiers stand. The settlement prices the tokens
the request used with the same card, less the plan's discount, as budgets
count it. Both are asked of the accounts in nano-units: a flat card whose
prices are whole nano-units per token (the common card) is priced in
integers (`usage_nanos`, the same figure as `usage_amount`'s, with no
Decimal made per request), any other by `usage_amount`, rounded.

**GPU-seconds**, where the tenant's price book charges them. Metering
attributes a replica's GPU time among the requests resident on it, so a
request is charged at most its replica's GPUs for as long as it ran there,
and a tenant's requests on one replica together at most that for as long
as any of them ran. Nothing in the model's limits bounds how long that is
(a long prompt, a busy replica, preemption), so the GPU part is a grant
renewed while the request runs, as a telephone network's prepaid credit
is: the reservation holds `grant_seconds` of the largest replica that may
serve it; half a grant before the request's replica would have used it
all (wall time x its GPUs), another grant is reserved under the same
lease; a grant that does not fit is asked again each second until the
last one nearly runs out, and then the request is stopped (`Cut`): a stream ends
with an error event, a plain request is answered 402, and what it used
is charged. The settlement charges the request's share of its replica's
GPUs among its tenant's requests there in this process (`ShareClock`),
never less than metering will attribute to them; the hourly correction
from the ledger then replaces the count with what metering attributed."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

from billing.pricing.rate_card import RateCard, usage_amount, usage_nanos
from billing.spend.accounts import MAX_UNITS, LocalSpend, RedisSpend, SpendRefused, nanos
from billing.spend.corrections import spend_correction_applied, spend_corrections_pending
from billing.spend.slices import SlicedSpend
from billing.spend.terms import PREPAID, SpendTerms
from core.calendar import epoch_hour, moment_epoch_hour
from gateway.errors import Refused
from gateway.orm import orm
from gateway.outcome import Cut

logger = logging.getLogger(__name__)
HUNDRED = Decimal(100)
ZERO = Decimal(0)
MICRO = Decimal("0.000001")
NO_CUT = nullcontext(None)  # a request with nothing to renew


@dataclass
class GpuGrant:
    """A held request's GPU-seconds: reserved so far, used by the bound
    (wall time x its replicas' GPUs) and by its share (what it settles to)."""

    price: Decimal  # per GPU-second
    granted: float  # GPU-seconds
    bound: float = 0.0
    share: float = 0.0
    # When it was stopped (its upstream closed, so vLLM ends it): the GPU
    # time it is charged ends there, however long a slow client then takes
    # to be sent the end of its answer.
    stopped_at: float | None = None


@dataclass(slots=True)
class Hold:
    """A request's reservation, and what its settlement is priced with (one
    is made per held request: a plain slotted class, quick to make)."""

    terms: SpendTerms
    lease_id: str
    card: RateCard
    done: dict[str, int]
    gpu: GpuGrant | None = None


class ShareClock:
    """Processor sharing among one tenant's requests on one replica, in one
    process: while n of them run there, each is charged the replica's GPUs
    over n. Together they are charged the GPUs for as long as any of them
    ran, which is at least what metering attributes to them (it splits
    the same time among every tenant's requests, and idle time to none)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # (tenant, replica) -> [requests running, GPU-seconds per request so far, when, GPUs]
        self._runs: dict[tuple[int, int], list] = {}

    def _advance(self, run: list) -> None:
        now = self._clock()
        if run[0]:
            run[1] += (now - run[2]) * run[3] / run[0]
        run[2] = now

    def join(self, key: tuple[int, int], gpus: float) -> tuple[tuple[int, int], float]:
        run = self._runs.setdefault(key, [0, 0.0, self._clock(), gpus])
        self._advance(run)
        run[0] += 1
        return key, run[1]

    def leave(self, token: tuple[tuple[int, int], float]) -> float:
        """The GPU-seconds charged to the request since it joined."""
        key, joined = token
        run = self._runs[key]
        self._advance(run)
        run[0] -= 1
        if not run[0]:
            del self._runs[key]
        return run[1] - joined


class SpendGuard:
    def __init__(
        self,
        store: LocalSpend | RedisSpend,
        *,
        lease_seconds: float,
        grant_seconds: float = 10.0,
        stop_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self._ttl = lease_seconds
        self._grant = grant_seconds
        # How long before its last grant runs out a request is stopped: time
        # for the close to reach vLLM, whose abort ends its GPU time (at
        # most half a grant; default a quarter grant, at most 1 s).
        self._stop = min(grant_seconds / 2, stop_seconds or min(1.0, grant_seconds / 4))
        self._clock = clock
        self.shares = ShareClock(clock)

    @classmethod
    def from_settings(cls, cfg: Mapping, *, redis_url: str) -> SpendGuard:
        """In this process's memory, or shared through Redis (in slices,
        where the settings ask: gateways then rarely meet on a key)."""
        store: LocalSpend | RedisSpend | SlicedSpend = LocalSpend()
        if redis_url:
            store = RedisSpend(redis_url, prefix=cfg["REDIS_PREFIX"])
            if cfg["SPEND_SLICES"]:
                store = SlicedSpend(store, ttl=cfg["SPEND_LEASE_SECONDS"])
        return cls(
            store,
            lease_seconds=cfg["SPEND_LEASE_SECONDS"],
            grant_seconds=cfg["SPEND_GPU_GRANT_SECONDS"],
            stop_seconds=cfg["SPEND_GPU_STOP_SECONDS"],
        )

    async def corrections_apply(self, correction_id: int | None) -> None:
        """The ledger's corrections of spend accounts (one, or every one not
        applied yet), each applied to the counters and its drift recorded."""
        try:
            rows = await orm(spend_corrections_pending, correction_id=correction_id)
            for row in rows:
                drift = await self.store.correct(
                    row.account, cut=moment_epoch_hour(row.cut), ledger=row.ledger
                )
                if drift is not None:
                    await orm(spend_correction_applied, correction_id=row.pk, drift=drift)
        except Exception:  # the next correction, or the next connection, tries again
            logger.exception("could not apply the ledger's spend corrections")

    async def reserve(
        self,
        terms: SpendTerms,
        *,
        model: str,
        request_id: str,
        prompt_tokens_max: int,
        output_tokens_max: int,
        choices: int,
        gpus: float | Callable[[], float] = 0,
        output_field: str | None = "max_tokens",
    ) -> Hold | Refused:
        """`gpus`: the most GPUs of any replica that may serve the request,
        or how to find it (asked only where the card prices GPU-seconds).
        `output_field`: the field bounding its output as the client named
        it (None: it generates none, as an embedding), said in a refusal."""
        card = terms.cards.get(model)
        if card is None:
            return Refused(
                409,
                "model_not_priced",
                f"the model `{model}` has no price in force for this tenant, and a tenant "
                "with a budget or prepaid credit may use only priced models",
                param="model",
            )
        done = terms.volume.get(model, {})
        output_max = output_tokens_max * choices
        gpu = None
        if card.per_gpu_second is not None and callable(gpus):
            gpus = gpus()
        if card.per_gpu_second is not None and gpus:
            gpu = GpuGrant(price=card.per_gpu_second, granted=self._grant * gpus)
        # In integers where the card allows (the common card, no GPU grant),
        # else the exact Decimal worst case: the same figure, rounded up once.
        want = None if gpu else usage_nanos(card, prompt=prompt_tokens_max, completion=output_max)
        if want is None:
            want = nanos(_worst(card, done, prompt_tokens_max, output_max, gpu), up=True)
        try:
            refused = await self.store.reserve(
                terms.limits, request_id, min(want, MAX_UNITS), ttl=self._ttl
            )
        except Exception as exc:  # Redis unreachable: fail closed
            logger.warning("request %s: spend accounts unreachable: %s", request_id, exc)
            return Refused(
                503,
                "spend_unavailable",
                "this tenant's spend accounts could not be reached to hold the request's "
                "cost: try again shortly",
                retry_after=1,
            )
        if refused is None:
            return Hold(terms, request_id, card, done, gpu)  # positional: quicker
        gpu_text = f", and its first {_seconds(gpu.granted)} GPU-seconds" if gpu else ""
        worst = _worst(card, done, prompt_tokens_max, output_max, gpu)
        return _refusal(
            terms,
            refused,
            f"this request may cost up to {_money(worst)} {terms.currency} "
            f"({prompt_tokens_max:,} prompt tokens and {output_max:,} output "
            f"tokens at most{gpu_text}): "
            + (f"lower {output_field}, or " if output_field else "send less input, or "),
            param=output_field or "input",
        )

    def running(
        self, hold: Hold | None, *, tenant_id: int, replica_id: int, gpus: float
    ) -> AbstractAsyncContextManager[Cut | None]:
        """While a held request runs on a replica of `gpus` GPUs: its grant
        renewed, and the Cut that stops it when a renewal does not fit (no
        Cut, and nothing done, for a request without a GPU grant)."""
        if hold is None or hold.gpu is None or not gpus:
            return NO_CUT
        return self._running(hold, hold.gpu, (tenant_id, replica_id), gpus)

    @asynccontextmanager
    async def _running(
        self, hold: Hold, grant: GpuGrant, key: tuple[int, int], gpus: float
    ) -> AsyncIterator[Cut]:
        cut = Cut()
        started = self._clock()
        token = self.shares.join(key, gpus)
        renewing = asyncio.create_task(self._renew(hold, grant, gpus, started, cut))
        try:
            yield cut
        finally:
            renewing.cancel()
            now = self._clock()
            share = self.shares.leave(token)
            if grant.stopped_at is not None and now > started:
                # Shared as before over the time it ran, up to its stop.
                share *= max(0.0, grant.stopped_at - started) / (now - started)
                now = grant.stopped_at
            grant.bound += (now - started) * gpus
            grant.share += share

    async def _renew(
        self, hold: Hold, grant: GpuGrant, gpus: float, started: float, cut: Cut
    ) -> None:
        used_before = grant.bound
        more = self._grant * gpus
        # Stopped this long before its grant runs out: time for the close
        # to reach vLLM, whose abort ends the request's GPU time.
        margin = self._stop
        while True:
            runs_out = started + (grant.granted - used_before) / gpus
            await asyncio.sleep(max(0.0, runs_out - self._grant / 2 - self._clock()))
            while True:
                try:
                    refused = await self.store.reserve(
                        hold.terms.limits,
                        hold.lease_id,
                        nanos(_gpu_amount(grant.price, more), up=True),
                        ttl=self._ttl,
                    )
                except Exception as exc:  # Redis unreachable: not renewed, asked again
                    logger.warning("request %s: GPU grant not renewed: %s", hold.lease_id, exc)
                    refused = exc
                if refused is None:
                    grant.granted += more
                    break
                if self._clock() >= runs_out - margin:
                    grant.stopped_at = self._clock()
                    cut.fire(self._stopped(hold, grant, more, refused))
                    return
                await asyncio.sleep(max(0.0, min(1.0, runs_out - margin - self._clock())))

    @staticmethod
    def _stopped(
        hold: Hold, grant: GpuGrant, more: float, refused: SpendRefused | Exception
    ) -> Refused:
        held = f"this request was stopped after the {_seconds(grant.granted)} GPU-seconds it held"
        if isinstance(refused, Exception):
            return Refused(
                503,
                "spend_unavailable",
                f"{held}: its tenant's spend accounts could not be reached to renew them",
                retry_after=1,
            )
        return _refusal(
            hold.terms,
            refused,
            f"{held}, since {_seconds(more)} more (up to "
            f"{_money(_gpu_amount(grant.price, more))} {hold.terms.currency}) did not fit: ",
        )

    async def settle(
        self, hold: Hold, *, prompt: int, cached: int, completion: int, received_at: float
    ) -> None:
        """Settle to what the request cost, for a request received at epoch
        seconds `received_at` (the hour the ledger files it under)."""
        discount = hold.terms.discount_percent
        units = None
        if hold.gpu is None and not discount:  # in integers where the card allows
            units = usage_nanos(hold.card, prompt=prompt, cached=cached, completion=completion)
        if units is None:
            gpu_seconds = ZERO
            if hold.gpu is not None:
                gpu_seconds = Decimal(repr(hold.gpu.share)).quantize(MICRO, ROUND_CEILING)
            actual = usage_amount(
                hold.card,
                done=hold.done,
                prompt=prompt,
                cached=cached,
                completion=completion,
                gpu_seconds=gpu_seconds,
            )
            if discount:
                actual -= actual * discount / HUNDRED
            units = nanos(actual)
        try:
            keys = hold.terms.account_keys
            hour = epoch_hour(received_at)
            await self.store.settle(keys, hold.lease_id, min(units, MAX_UNITS), hour=hour)
        except Exception as exc:  # its lease expires; the ledger's correction counts it
            logger.warning("request %s: not settled (%s nano-units): %s", hold.lease_id, units, exc)


def _refusal(
    terms: SpendTerms, refused: SpendRefused, why: str, param: str | None = "max_tokens"
) -> Refused:
    """402 naming the account that refused, what is left on it, and `why`
    (the request's worst case, or the grant that did not fit); `param`:
    the field that bounds its cost (its output's, as the client named it)."""
    account = terms.accounts[refused.index]
    currency = terms.currency
    if account.kind == PREPAID:
        return Refused(
            402,
            "insufficient_credit",
            f"the prepaid balance has {_money(refused.left)} {currency} left (credit of "
            f"{_money(account.limit)} less usage not yet invoiced and requests in flight), "
            f"and {why}add credit",
            param=param,
        )
    return Refused(
        402,
        "budget_exceeded",
        f"the budget has {_money(refused.left)} {currency} left of "
        f"{_money(account.limit)} this period, and {why}raise the budget",
        param=param,
    )


def _worst(
    card: RateCard, done: dict[str, int], prompt: int, output: int, gpu: GpuGrant | None
) -> Decimal:
    """A request's worst case, exact: its most tokens priced where the
    period's volume stands, and its first GPU grant."""
    worst = usage_amount(card, done=done, prompt=prompt, completion=output)
    return worst + _gpu_amount(gpu.price, gpu.granted) if gpu is not None else worst


def _gpu_amount(price: Decimal, seconds: float) -> Decimal:
    return price * Decimal(repr(seconds))


def _seconds(seconds: float) -> str:
    return format(Decimal(repr(seconds)).quantize(Decimal("0.1")).normalize(), "f")


def _money(amount: Decimal) -> str:
    """Enough places to tell a budget's last cents from nothing."""
    return format(amount.quantize(MICRO).normalize(), "f")
