"""SLO compliance and the credits it earns, from ledger rows worked by
hand (tests/slo.py: Alpha's day is 87.5 % available, TTFT p95 190.5 ms,
inter-token p95 190.5 ms)."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

from billing.models import Plan, Subscription
from billing.sla.compliance import (
    availability_percent,
    compliance_by_tenant,
    figure_text,
    sla_credits,
)
from billing.sla.policies import slo_policies_at
from tests.ledger import T0
from tests.slo import slo_day, slo_policy

D = Decimal
DAY = T0.replace(hour=0)


def test_a_tenants_day_against_its_targets(ledger):
    policy = slo_policy(availability="99.9", ttft="150", itl="200")
    slo_day(ledger, ledger.a, T0)
    slo_day(ledger, ledger.b, T0 + timedelta(days=1), prefix="b")  # another day, another tenant
    policies = slo_policies_at(tenants=[ledger.a], moment=DAY)
    assert policies == {ledger.a.pk: policy}  # the tier's default
    (day,) = compliance_by_tenant(
        policies=policies, start=DAY, end=DAY + timedelta(days=2), by_day=True
    )[ledger.a.pk]
    assert day.day == date(2026, 10, 5)
    assert (day.requests, day.failed) == (24, 3)
    assert day.availability == D("87.5000")  # 21 / 24
    assert (day.ttft_p95_ms, day.itl_p95_ms) == (D("190.500"), D("190.500"))
    met = {m.metric: m.met for m in day.metrics}
    assert met == {"availability": False, "ttft_p95": False, "itl_p95": True}
    assert day.breached


def test_the_highest_step_per_metric_and_metrics_add_up_to_the_cap(ledger):
    slo_day(ledger, ledger.a, T0)
    policy = slo_policy(cap="27")
    (period,) = compliance_by_tenant(
        policies={ledger.a.pk: policy}, start=DAY, end=DAY + timedelta(days=1), by_day=False
    )[ledger.a.pk]
    credits = sla_credits(period)
    # 87.5 % is under both 99.9 % (10 %) and 99 % (25 %): 25 %; TTFT 5 %, cut to the cap.
    assert [(c.metric, c.percent) for c in credits] == [("availability", 25), ("ttft_p95", 2)]
    assert credits[0].text == "availability 87.50% < 99.00% (target 99.90%)"
    assert credits[1].text == "TTFT p95 190.5 ms > 150 ms target"


def test_a_plans_policy_wins_over_its_tiers(ledger):
    slo_policy(name="tier default")
    gold = Plan.objects.create(name="gold")
    own = slo_policy(name="gold", plan=gold)
    Subscription.objects.create(tenant=ledger.b, plan=gold, start=DAY - timedelta(days=30))
    policies = slo_policies_at(tenants=[ledger.a, ledger.b], moment=DAY)
    assert policies[ledger.b.pk] == own
    assert policies[ledger.a.pk].name == "tier default"


def test_no_requests_no_breach_and_figures_never_round_up_to_a_target():
    assert availability_percent(requests=0, failed=0) is None
    # 99,899 of 100,000 is 99.899 %: 99.90 % to the nearest hundredth, but
    # against the 99.90 % target it missed, 99.899 %, never 99.90 %.
    assert availability_percent(requests=100_000, failed=101) == D("99.8990")
    assert figure_text("availability", D("99.8990"), measured=True) == "99.90%"
    assert figure_text("availability", D("99.8990"), measured=True, against=D("99.9")) == "99.899%"
    assert figure_text("availability", D("99.8990"), measured=True, against=D("99.8")) == "99.90%"
    # 47 of 48: 97.9166...: 97.92 %, rounded to the nearest, not truncated.
    assert figure_text("availability", availability_percent(requests=48, failed=1),
                       measured=True, against=D("99.9")) == "97.92%"  # fmt: skip
    assert figure_text("ttft_p95", D("150.001"), measured=True) == "150.1 ms"
    assert figure_text("availability", D("99.9")) == "99.90%"
