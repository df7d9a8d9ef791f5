"""Slices: a gateway's share of a tenant's accounts held in Redis, so that
most reservations and settlements never wait on Redis (the hot path's cost,
measured), as a telephone network's switch spends prepaid credit from a quota
its charging system granted it.

A gateway process reserves a slice of each account set it serves (one
reservation in Redis under the slice's own lease, `SLICE_REQUESTS` times
the request that asked for it) and admits requests against it in
process: a request's worst case fits if the slice's free part (granted,
less what its requests in flight hold, less what they were charged and
not yet drawn) covers it. Nothing it admits is beyond what Redis holds
for it, so the limit holds across every gateway as before. What requests
are charged is drawn from the slice into the accounts' spend every
`DRAW_SECONDS` (one script for all of them), which also moves the slice
lease's expiry; a slice's free part running low is topped up in the
background, before a request has to wait for it.

**Near the limit** a slice is granted only while `SPARE` times it stays
left besides (so slices never hold the last of a budget), and once a
top-up is refused the gateway gives its free part back and reserves each
request in Redis directly for `DIRECT_SECONDS`: exact, refused with what
is really left. A request too big for a slice goes directly too.

**A slice idle** for `IDLE_SECONDS` gives its free part back. **A gateway
that dies** stops renewing its slices, whose leases expire after
`SLICE_TTL` seconds; the charges it had not drawn (at most `DRAW_SECONDS`
of them) reach the accounts through the ledger's correction, as a lost
settlement does.

`state()` reads Redis: a slice's free part shows as reserved there, and
charges appear up to `DRAW_SECONDS` late."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from billing.spend.accounts import Limit, RedisSpend, SpendRefused, SpendState

logger = logging.getLogger(__name__)
SLICE_REQUESTS = 16  # a slice is granted for this many requests like the one asking
SPARE = 4  # ... only while this many times it stays left on every account besides
SLICE_TTL = 10.0  # seconds a dead gateway's slice outlives it
DRAW_SECONDS = 0.05  # charges are drawn into the accounts this often
IDLE_SECONDS = 2.0  # a slice unused this long gives its free part back
DIRECT_SECONDS = 1.0  # after a refused top-up, requests reserve in Redis this long


@dataclass
class _Slice:
    limits: tuple[Limit, ...]
    lease_id: str
    granted: int = 0  # nano-units its lease holds in Redis (as far as this process knows)
    held: dict[str, int] = field(default_factory=dict)  # request lease -> worst case held
    holding: int = 0  # sum of held
    charged: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # hour -> units
    charging: int = 0  # sum of charged, not yet drawn into the accounts
    last_use: float = 0.0  # ok-float: monotonic seconds
    last_draw: float = 0.0  # ok-float: monotonic seconds
    direct_until: float = 0.0  # ok-float: monotonic seconds
    topping: asyncio.Future | None = None
    # A draw sent whose outcome is unknown (an error: it may have run):
    # (its id, release, charged by hour, charging), sent again as it was
    # before any other, so that it is done once whatever happened to it.
    unsent: tuple[str, int, dict[int, int], int] | None = None

    @property
    def free(self) -> int:
        unsent = self.unsent[3] if self.unsent is not None else 0
        return self.granted - self.holding - self.charging - unsent


class SlicedSpend:
    """RedisSpend's interface, with reservations and settlements served
    from this process's slices where they fit."""

    def __init__(
        self,
        inner: RedisSpend,
        *,
        ttl: float | None = None,
        clock=time.monotonic,  # ok-float: seconds
    ) -> None:
        """`ttl`: how long a slice outlives its gateway (at most SLICE_TTL;
        never longer than a request's own lease, so what a dead gateway
        held goes when its requests' leases would have)."""
        self.inner = inner
        self._ttl = min(SLICE_TTL, ttl) if ttl else SLICE_TTL
        self._clock = clock
        self._instance = uuid.uuid4().hex[:12]
        # One slice per set of accounts and their limits: not per seed (the
        # ledger's spend when the terms were read), which changes at every
        # reload of a tenant's terms and would leave the old slice holding
        # budget until it idled.
        self._slices: dict[tuple, _Slice] = {}
        self._held_in: dict[str, _Slice] = {}  # request lease -> its slice
        self._direct: set[str] = set()  # request leases reserved in Redis
        self._drawing: asyncio.Task | None = None
        self.redis_calls = 0  # reservations and settlements that went to Redis (a statistic)

    # --- the store's interface -------------------------------------------
    async def reserve(
        self,
        limits: Sequence[Limit],
        lease_id: str,
        want: int,
        *,
        ttl: float,  # ok-float: seconds
    ) -> SpendRefused | None:
        limits = limits if isinstance(limits, tuple) else tuple(limits)
        key = tuple((limit.key, limit.limit) for limit in limits)
        piece = self._slices.get(key)
        if piece is None:
            piece = self._slices[key] = _Slice(limits, f"slice:{self._instance}:{lease_id}")
        piece.limits = limits  # the latest seeds, should an account need creating
        piece.last_use = now = self._clock()
        self._start_drawing()
        if lease_id not in self._direct and now >= piece.direct_until:
            if piece.free < want:
                await self._top_up(piece, want)
            if piece.free >= want:
                self._hold(piece, lease_id, want)
                if piece.free < want * SLICE_REQUESTS // 4 and now >= piece.direct_until:
                    self._top_up_later(piece, want)
                return None
        self.redis_calls += 1
        refused = await self.inner.reserve(limits, lease_id, want, ttl=ttl)
        if refused is None:
            self._direct.add(lease_id)
        return refused

    async def settle(self, keys: Sequence[str], lease_id: str, units: int, *, hour: int) -> None:
        piece = self._held_in.pop(lease_id, None)
        if piece is not None:
            piece.holding -= piece.held.pop(lease_id)
            piece.charged[hour] += units
            piece.charging += units
        if lease_id in self._direct:
            self._direct.discard(lease_id)
            self.redis_calls += 1
            # Charged on the slice already, or here: once either way.
            await self.inner.settle(keys, lease_id, 0 if piece is not None else units, hour=hour)

    async def correct(self, key: str, *, cut: int, ledger: Decimal) -> Decimal | None:
        return await self.inner.correct(key, cut=cut, ledger=ledger)

    async def state(self, key: str) -> SpendState | None:
        return await self.inner.state(key)

    async def close(self) -> None:
        """Everything charged drawn and every free part given back."""
        if self._drawing is not None:
            self._drawing.cancel()
        for piece in list(self._slices.values()):
            try:
                if piece.unsent is not None:  # first the draw that failed, then the rest
                    await self._draw(piece, release=True)
                await self._draw(piece, release=True)
            except Exception:  # the leases expire
                logger.warning("could not draw a spend slice at close", exc_info=True)
        await self.inner.close()

    # --- slices --------------------------------------------------------------
    def _hold(self, piece: _Slice, lease_id: str, want: int) -> None:
        piece.held[lease_id] = piece.held.get(lease_id, 0) + want
        piece.holding += want
        self._held_in[lease_id] = piece

    async def _top_up(self, piece: _Slice, want: int) -> None:
        """Grow the slice so `want` fits (one top-up at a time; the others
        wait for it). A refusal sends requests to Redis for a while."""
        if piece.topping is None:
            grow = max(want * SLICE_REQUESTS, want - piece.free)
            piece.topping = asyncio.ensure_future(self._grow(piece, grow))
            piece.topping.add_done_callback(_log_failure)  # its waiters may be gone
        await asyncio.shield(piece.topping)

    def _top_up_later(self, piece: _Slice, want: int) -> None:
        if piece.topping is None:
            piece.topping = asyncio.ensure_future(self._grow(piece, want * SLICE_REQUESTS))
            piece.topping.add_done_callback(_log_failure)

    async def _grow(self, piece: _Slice, grow: int) -> None:
        try:
            self.redis_calls += 1
            refused = await self.inner.reserve(
                piece.limits,
                piece.lease_id,
                grow,
                ttl=self._ttl,
                spare=grow * SPARE,
            )
            if refused is None:
                piece.granted += grow
                piece.last_draw = self._clock()
            else:  # near the limit: its free part goes back, requests go direct
                piece.direct_until = self._clock() + DIRECT_SECONDS
                await self._draw(piece, release=True)
        finally:
            piece.topping = None

    def _start_drawing(self) -> None:
        if self._drawing is None or self._drawing.done():
            self._drawing = asyncio.get_running_loop().create_task(self._draw_loop())

    async def _draw_loop(self) -> None:
        while self._slices:
            await asyncio.sleep(DRAW_SECONDS)
            now = self._clock()
            for key, piece in list(self._slices.items()):
                idle = not piece.holding and now - piece.last_use > IDLE_SECONDS
                due = now - piece.last_draw > self._ttl / 4  # keep the lease alive
                if piece.charging or piece.unsent or idle or (due and piece.granted):
                    try:
                        await self._draw(piece, release=idle)
                    except (ConnectionError, OSError, TimeoutError) as exc:
                        # Redis away (a failover, a restart): drawn on a later
                        # pass, or corrected; a line, not a traceback, each time.
                        logger.warning("could not draw a spend slice: %s", exc)
                        continue
                    except Exception:
                        logger.warning("could not draw a spend slice", exc_info=True)
                        continue
                if (
                    idle
                    and not (piece.granted or piece.charging or piece.unsent)
                    and piece.topping is None
                ):
                    del self._slices[key]

    async def _draw(self, piece: _Slice, *, release: bool) -> None:
        """Draw what the slice's requests were charged into the accounts
        and, with `release`, give its free part back. A draw that failed
        is sent again first, as it was (its id makes it once: an error can
        come after Redis ran it, a failover can lose it or not); what was
        charged since waits for the next."""
        if piece.unsent is None:
            charged, piece.charged = piece.charged, defaultdict(int)
            charging, piece.charging = piece.charging, 0
            give = max(0, piece.granted - piece.holding - charging) if release else 0
            piece.granted -= give
            piece.unsent = (uuid.uuid4().hex, give, dict(charged), charging)
        op, give, charged, charging = piece.unsent
        self.redis_calls += 1
        before = await self.inner.slice_draw(
            piece.limits, piece.lease_id, release=give, settled=charged, ttl=self._ttl, op=op
        )
        piece.unsent = None
        piece.last_draw = self._clock()
        # What the lease holds now, as Redis saw it (0 if it expired: the
        # requests in flight on it are no longer backed, and new ones top up).
        piece.granted = max(0, before - give - charging) if before else 0


def _log_failure(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.warning("a spend slice's top-up failed: %s", future.exception())
