"""Synthetic usage history: rows marked synthetic, a replica never busier
than its GPUs, the same rows for the same seed, a re-run replaces rather
than adds, and real usage is never touched."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db.models import Sum

from metering.history import HistoryShape, HistoryStream, history_rows, history_write
from metering.models import UsageRollup

START = datetime(2026, 3, 2, tzinfo=UTC)  # a Monday
END = START + timedelta(days=14)


def _streams(ledger, *, heavy: int = 40_000_000) -> list[HistoryStream]:
    common = {
        "replica_id": ledger.replica.pk,
        "pool_id": ledger.pool.pk,
        "served_model_id": ledger.model.pk,
        "gpus": 1,
    }
    return [
        HistoryStream(tenant_id=ledger.a.pk, tokens_per_hour=heavy, **common),
        HistoryStream(tenant_id=ledger.b.pk, tokens_per_hour=200_000, shape="nightly", **common),
    ]


def test_rows_are_synthetic_and_a_replica_is_never_busier_than_its_gpus(ledger):
    written = history_write(_streams(ledger), start=START, end=END)

    rows = UsageRollup.objects.all()
    assert written == rows.count() > 0
    assert not rows.filter(synthetic=False).exists()
    assert rows.filter(hour__lt=START).count() == rows.filter(hour__gte=END).count() == 0
    busy = defaultdict(Decimal)
    for hour, seconds in rows.values_list("hour", "device_seconds"):
        busy[hour] += seconds
    # 40M tokens an hour would need ~9,000 device-seconds: capped at 97 % of 3,600.
    assert max(busy.values()) <= Decimal("3492")
    assert max(busy.values()) > Decimal("3400")


def test_the_shape_shows_in_the_hours(ledger):
    rows = history_rows(_streams(ledger, heavy=100_000), start=START, end=END, seed=3)
    by = defaultdict(int)
    for hour, tenant, *_, prompt, _cached, completion, _requests, _seconds in rows:
        if tenant == ledger.a.pk:
            by[
                "weekday-noon"
                if hour.weekday() < 5 and hour.hour == 13
                else "weekday-3am"
                if hour.weekday() < 5 and hour.hour == 3
                else "weekend-noon"
                if hour.hour == 13
                else "other"
            ] += prompt + completion
        elif hour.hour < 6:
            by["nightly-night"] += prompt + completion
        else:
            by["nightly-day"] += prompt + completion
    # Business hours beat the night, weekdays beat weekends (per hour), the
    # nightly batch runs at night.
    assert by["weekday-noon"] / 10 > 3 * by["weekday-3am"] / 10
    assert by["weekday-noon"] / 10 > by["weekend-noon"] / 4
    assert by["nightly-night"] / 6 > 5 * by["nightly-day"] / 18


def test_same_seed_same_rows_and_a_rerun_replaces_them(ledger):
    streams = _streams(ledger, heavy=500_000)
    assert history_rows(streams, start=START, end=END, seed=11) == history_rows(
        streams, start=START, end=END, seed=11
    )
    assert history_rows(streams, start=START, end=END, seed=11) != history_rows(
        streams, start=START, end=END, seed=12
    )
    first = history_write(streams, start=START, end=END, seed=11)
    totals = UsageRollup.objects.aggregate(Sum("prompt_tokens"))
    again = history_write(streams, start=START, end=END, seed=11)
    assert first == again == UsageRollup.objects.count()
    assert UsageRollup.objects.aggregate(Sum("prompt_tokens")) == totals


def test_real_usage_is_kept_and_its_stream_hour_not_overwritten(ledger):
    hour = START + timedelta(hours=13)
    real = UsageRollup.objects.create(
        hour=hour,
        tenant=ledger.a,
        served_model=ledger.model,
        pool=ledger.pool,
        replica=ledger.replica,
        prompt_tokens=7,
        completion_tokens=7,
        device_seconds=Decimal("1.5"),
    )
    history_write(_streams(ledger, heavy=500_000), start=START, end=END)
    history_write(_streams(ledger, heavy=900_000), start=START, end=END)  # and again

    real.refresh_from_db()
    assert (real.prompt_tokens, real.synthetic) == (7, False)
    assert UsageRollup.objects.filter(hour=hour, tenant=ledger.a).count() == 1
    assert UsageRollup.objects.filter(hour=hour, tenant=ledger.b, synthetic=True).exists()


def test_an_unknown_shape_is_refused(ledger):
    stream = HistoryStream(
        tenant_id=ledger.a.pk,
        replica_id=ledger.replica.pk,
        pool_id=ledger.pool.pk,
        served_model_id=ledger.model.pk,
        gpus=1,
        tokens_per_hour=1,
        shape="weekly",
    )
    with pytest.raises(ValueError, match="shape must be one of"):
        history_rows([stream], start=START, end=END, shape=HistoryShape())
