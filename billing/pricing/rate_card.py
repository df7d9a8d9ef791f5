"""A model's prices as plain data, and one request's usage priced with
them: what the gateway reserves and settles per request (gateway.spend),
with the same arithmetic rating uses for a period (billing.pricing.rating),
so a hold and an invoice never disagree. No model and no database here:
the gateway imports this module on its hot path, and rating turns a price
book's rows into cards (`RateCard.of`)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property
from typing import Any, Protocol

MILLION = Decimal(1_000_000)
# billing.choices.TokenKind's values (a Django choices class, which this
# module may not import): what a token price applies to.
INPUT, CACHED_INPUT, OUTPUT = "input", "cached_input", "output"
TOKEN_KINDS = (INPUT, CACHED_INPUT, OUTPUT)


class PricedModel(Protocol):
    """A model's price in a book as rating reads it (billing.models.ModelPrice)."""

    per_gpu_second: Decimal | None
    tiers: Any  # its graduated tiers (a related manager)

    def per_mtok(self, kind: str) -> Decimal: ...


@dataclass(frozen=True)
class RateCard:
    """One model's prices in one book, as plain data: per token kind the
    steps (from_tokens, price per million) of its graduated tiers (a flat
    price is one step from 0), and the price per GPU-second (None: none)."""

    steps: dict[str, tuple[tuple[int, Decimal], ...]]
    per_gpu_second: Decimal | None = None

    @classmethod
    def of(cls, price: PricedModel) -> RateCard:
        """From a model's price in a book (a billing.models.ModelPrice)."""
        tiers = list(price.tiers.all())  # ordered by kind, from_tokens
        steps = {}
        for kind in TOKEN_KINDS:
            own = tuple((t.from_tokens, t.per_mtok) for t in tiers if t.kind == kind)
            steps[kind] = own or ((0, price.per_mtok(kind)),)
        return cls(steps=steps, per_gpu_second=price.per_gpu_second)

    def scaled(self, rate: Decimal) -> RateCard:
        """The same card with every price times `rate` (prices in another
        currency, converted at a dated rate: billing.pricing.rating)."""
        return RateCard(
            steps={k: tuple((t, p * rate) for t, p in s) for k, s in self.steps.items()},
            per_gpu_second=None if self.per_gpu_second is None else self.per_gpu_second * rate,
        )

    @cached_property
    def flat(self) -> tuple[Decimal, ...] | None:
        """Per-million prices by TOKEN_KINDS when no kind has tiers (the
        common card, priced on every request at the gateway), else None."""
        steps = [self.steps[kind] for kind in TOKEN_KINDS]
        if any(len(s) != 1 for s in steps):
            return None
        return tuple(s[0][1] for s in steps)

    @cached_property
    def flat_nanos(self) -> tuple[int, ...] | None:
        """`flat` per token in whole nano-units of the currency (1e-9), where
        every price is a whole number of them (a per-million price of at
        most three decimal places), else None."""
        if self.flat is None:
            return None
        per_token = [price.scaleb(3) for price in self.flat]  # per million -> nanos per token
        if any(price != price.to_integral_value() for price in per_token):
            return None
        return tuple(int(price) for price in per_token)


def card_pieces(card: RateCard, kind: str, done: int, tokens: int):
    """(tokens, price per million) pieces of `tokens` more of `kind`, after
    `done` of it in the period so far."""
    steps = card.steps[kind]
    if len(steps) == 1:  # a flat price (the gateway prices every request: kept quick)
        if tokens > 0:
            yield Decimal(tokens), steps[0][1]
        return
    bounds = [start for start, _ in steps[1:]] + [None]
    position, left = done, tokens
    for (start, per_mtok), upto in zip(steps, bounds, strict=True):
        if left <= 0:
            return
        if upto is not None and position >= upto:
            continue
        take = left if upto is None else min(left, upto - max(position, start))
        if take > 0:
            yield Decimal(take), per_mtok
            position += take
            left -= take


def usage_counts(*, prompt: int, cached: int, completion: int) -> dict[str, int]:
    """Tokens by kind: cached prompt tokens are priced apart from the rest."""
    return {
        INPUT: prompt - cached,
        CACHED_INPUT: cached,
        OUTPUT: completion,
    }


def usage_amount(
    card: RateCard,
    *,
    done: dict[str, int],
    prompt: int,
    cached: int = 0,
    completion: int = 0,
    gpu_seconds: Decimal = Decimal(0),
) -> Decimal:
    """What this much usage costs after `done` tokens by kind of the same
    model in the period, exact and unrounded (as rating's lines are)."""
    flat = card.flat
    if flat is not None:  # card_pieces' one step per kind, without walking it
        # Decimal times int is exact, and so is moving the point: the same
        # amount as the pieces summed one by one, for a third of the time
        # (the gateway prices every held request twice).
        amount = _flat_sum(flat, prompt, cached, completion).scaleb(-6)
    else:
        amount = Decimal(0)
        counts = usage_counts(prompt=prompt, cached=cached, completion=completion)
        for kind, tokens in counts.items():
            if not tokens:
                continue
            for quantity, per_mtok in card_pieces(card, kind, done.get(kind, 0), tokens):
                amount += quantity * per_mtok / MILLION
    if card.per_gpu_second is not None and gpu_seconds:
        amount += gpu_seconds * card.per_gpu_second
    return amount


def usage_nanos(card: RateCard, *, prompt: int, cached: int = 0, completion: int = 0) -> int | None:
    """`usage_amount` of this usage (no GPU-seconds) in whole nano-units of
    the currency, as an int, where it is one: a flat card whose prices are
    whole nano-units per token (`flat_nanos`); None otherwise. The same
    sum in integers, exact: the gateway's hold on the common card, with no
    Decimal to make (a flat price does not depend on the volume so far)."""
    per_token = card.flat_nanos
    if per_token is None:
        return None
    return _flat_sum(per_token, prompt, cached, completion)


def _flat_sum(prices, prompt: int, cached: int, completion: int):
    """Tokens by kind (usage_counts) times a flat card's prices, summed."""
    per_input, per_cached, per_output = prices
    return (
        max(prompt - cached, 0) * per_input
        + max(cached, 0) * per_cached
        + max(completion, 0) * per_output
    )
