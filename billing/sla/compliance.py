"""SLO compliance: a tenant's figures over a day or a billing period,
measured in SQL from the ledger (metering.selectors.slo.slo_figures), against
its policy's targets; and the SLA credit a missed period earns.

The figures (the ledger fields each comes from are in metering.selectors.slo):
- availability: of the requests counted (all but those refused for the
  tenant's own cause: its rate limits and budgets, bad requests), the
  share that did not fail for a platform cause (5xx, 503 no replica, 429
  from the platform's queue), in percent, floored to 0.0001 (shown to the
  nearest 0.01, see figure_text);
- TTFT p95: what completed requests waited for their first token, from
  the gateway receiving them;
- inter-token latency p95: per completed request of two tokens or more,
  (ended_at - first_token_at) / (completion_tokens - 1).
A figure without a sample (no requests) cannot miss its target.

Credits: per metric, of the policy's steps that the figure misses (below
the threshold for availability, above it for latencies; a step without a
threshold is the target), the one that pays most. Metrics add up, in the
order of SloMetric, to the policy's cap (the last ones are cut to fit)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from decimal import ROUND_CEILING, ROUND_FLOOR, ROUND_HALF_UP, Decimal

from billing.choices import SloMetric
from billing.models import SlaCreditRule, SloPolicy
from metering.selectors.slo import slo_figures

PERCENT_PLACES = Decimal("0.0001")
HUNDRED = Decimal(100)
LABELS = {
    SloMetric.AVAILABILITY: "availability",
    SloMetric.TTFT_P95: "TTFT p95",
    SloMetric.ITL_P95: "inter-token latency p95",
}


def availability_percent(*, requests: int, failed: int) -> Decimal | None:
    """The share of `requests` that did not fail, in percent (floored, so a
    figure never rounds up to a target it missed); None without requests."""
    if not requests:
        return None
    return (Decimal(requests - failed) * HUNDRED / requests).quantize(
        PERCENT_PLACES, rounding=ROUND_FLOOR
    )


def misses(metric: str, measured: Decimal, threshold: Decimal) -> bool:
    if metric == SloMetric.AVAILABILITY:
        return measured < threshold
    return measured > threshold


def figure_text(
    metric: str, value: Decimal, *, measured: bool = False, against: Decimal | None = None
) -> str:
    """'98.70%' or '812.5 ms'. A measured availability is rounded to the
    nearest 0.01 (47 of 48: 97.92%), unless that would hide a miss of the
    threshold `against`: then it keeps its places (97.9166% < 97.92%). A
    measured latency is rounded up, so a miss never reads as equal to the
    figure it missed."""
    if metric == SloMetric.AVAILABILITY:
        if measured:
            nearest = value.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
            hidden = (
                against is not None
                and misses(metric, value, against)
                and not misses(metric, nearest, against)
            )
            value = value.normalize() if hidden else nearest  # hidden: 3+ places
        elif value == value.quantize(Decimal("0.01")):
            value = value.quantize(Decimal("0.01"))
        return f"{_plain(value)}%"
    if measured:
        value = value.quantize(Decimal("0.1"), rounding=ROUND_CEILING)
    return f"{_plain(value.normalize())} ms"


def _plain(value: Decimal) -> str:
    return format(value, "f")


@dataclass(frozen=True)
class MetricResult:
    """One metric of one tenant's day or period against its target."""

    metric: str
    measured: Decimal | None
    target: Decimal | None

    @property
    def met(self) -> bool | None:
        """False: missed; True: met; None: no target or no sample."""
        if self.measured is None or self.target is None:
            return None
        return not misses(self.metric, self.measured, self.target)

    @property
    def label(self) -> str:
        return LABELS[SloMetric(self.metric)]

    @property
    def measured_text(self) -> str:
        if self.measured is None:
            return "—"
        return figure_text(self.metric, self.measured, measured=True, against=self.target)

    @property
    def target_text(self) -> str:
        return "—" if self.target is None else figure_text(self.metric, self.target)


@dataclass(frozen=True)
class Compliance:
    """A tenant's (or a tier's) figures over one UTC day, or over a whole
    range when `day` is None, against `policy` (None: nothing promised)."""

    key: int | str
    day: date | None
    requests: int
    failed: int
    timed: int
    availability: Decimal | None
    ttft_p95_ms: Decimal | None
    itl_p95_ms: Decimal | None
    policy: SloPolicy | None

    def measured(self, metric: str) -> Decimal | None:
        return {
            SloMetric.AVAILABILITY: self.availability,
            SloMetric.TTFT_P95: self.ttft_p95_ms,
            SloMetric.ITL_P95: self.itl_p95_ms,
        }[SloMetric(metric)]

    @property
    def metrics(self) -> list[MetricResult]:
        return [
            MetricResult(
                metric=m,
                measured=self.measured(m),
                target=self.policy.target(m) if self.policy else None,
            )
            for m in SloMetric.values
        ]

    @property
    def breached(self) -> bool:
        return any(result.met is False for result in self.metrics)


def compliance_from_figures(row: dict, policy: SloPolicy | None) -> Compliance:
    """One row of metering.selectors.slo.slo_figures against `policy`."""
    return Compliance(
        key=row["key"],
        day=row["day"],
        requests=row["requests"],
        failed=row["failed"],
        timed=row["timed"],
        availability=availability_percent(requests=row["requests"], failed=row["failed"]),
        ttft_p95_ms=row["ttft_p95_ms"],
        itl_p95_ms=row["itl_p95_ms"],
        policy=policy,
    )


def compliance_by_tenant(
    *,
    policies: dict[int, SloPolicy | None],
    start: datetime,
    end: datetime,
    by_day: bool,
    every_tenant: bool = False,
) -> dict[int, list[Compliance]]:
    """The compliance of the tenants of `policies` (their ids) over [start,
    end): one entry for the range, or one per UTC day with requests when
    `by_day`; tenants without requests have none. One query for all of
    them; `every_tenant` (finance staff code paths only) reads every
    tenant's ledger rows without naming them."""
    rows = slo_figures(
        start=start, end=end, tenant_ids=None if every_tenant else list(policies), by_day=by_day
    )
    out: dict[int, list[Compliance]] = {}
    for row in rows:
        if row["key"] in policies:
            out.setdefault(row["key"], []).append(
                compliance_from_figures(row, policies[row["key"]])
            )
    return out


@dataclass(frozen=True)
class SlaCredit:
    """What one missed metric earns: `percent` of the period's usage
    charges, from the step with `threshold` (the target when it has none)."""

    metric: str
    percent: Decimal
    measured: Decimal
    threshold: Decimal
    target: Decimal | None

    @property
    def text(self) -> str:
        """'availability 98.70% < 99.90% target', or with a step that is not
        the target: 'availability 98.70% < 99.00% (target 99.90%)'."""
        sign = "<" if self.metric == SloMetric.AVAILABILITY else ">"
        measured = figure_text(self.metric, self.measured, measured=True, against=self.threshold)
        threshold = figure_text(self.metric, self.threshold)
        head = f"{LABELS[SloMetric(self.metric)]} {measured} {sign} {threshold}"
        if self.target is None or self.target == self.threshold:
            return f"{head} target" if self.target is not None else head
        return f"{head} (target {figure_text(self.metric, self.target)})"


def sla_credits(compliance: Compliance) -> list[SlaCredit]:
    """The credits a period's compliance earns under its policy."""
    policy = compliance.policy
    if policy is None:
        return []
    left = policy.credit_cap_percent
    out: list[SlaCredit] = []
    rules: list[SlaCreditRule] = list(policy.credit_rules.all())
    for metric in SloMetric.values:
        measured, target = compliance.measured(metric), policy.target(metric)
        if measured is None:
            continue
        steps = [
            (rule, rule.threshold if rule.threshold is not None else target)
            for rule in rules
            if rule.metric == metric
        ]
        hits = [(r, t) for r, t in steps if t is not None and misses(metric, measured, t)]
        if not hits:
            continue
        rule, threshold = max(hits, key=lambda hit: hit[0].credit_percent)
        percent = min(rule.credit_percent, left)
        if percent <= 0:
            break
        left -= percent
        out.append(SlaCredit(metric, percent, measured, threshold, target))
    return out
