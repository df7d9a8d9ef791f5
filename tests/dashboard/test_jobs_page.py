"""The jobs page and /metrics: every scheduled job with its schedule in
words, last success, last failure with its error, and next run; a job
with no success within two periods is marked late; task outcomes are
recorded from Celery's signals by task and beat entry."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask
from prometheus_client.parser import text_string_to_metric_families

from billing.tasks import budgets_check_task, margin_report_task
from config.schedule import BEAT_SCHEDULE
from core.models import JobStatus
from tests.factories import make_finance_user

pytestmark = pytest.mark.django_db


def _rows(client) -> dict[str, str]:
    """Job name -> its table row's text (tags stripped)."""
    response = client.get("/jobs/")
    assert response.status_code == 200
    html = response.content.decode()
    rows = re.findall(r'<tr data-job="([^"]+)"[^>]*>(.*?)</tr>', html, re.S)
    return {name: " ".join(re.sub(r"<[^>]+>", " ", body).split()) for name, body in rows}


def gauges(client, name: str) -> dict[str, float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    return {
        s.labels["job"]: s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
        if s.name == name
    }


@pytest.fixture
def finance(client):
    client.force_login(make_finance_user())
    return client


def test_every_scheduled_job_is_listed_with_its_schedule_in_words(finance):
    rows = _rows(finance)

    assert set(rows) == set(BEAT_SCHEDULE)
    assert "every 15 s" in rows["replicas-scrape"]
    assert "every minute" in rows["metering-run"]
    assert "every 6 hours" in rows["metering-partitions"]
    assert "hourly at :10" in rows["metering-reconcile"]
    assert "daily at 00:30 UTC" in rows["billing-allocation-daily"]
    assert "Mondays at 03:00 UTC" in rows["billing-margin-flash"]
    assert "monthly on day 2 at 04:00 UTC" in rows["billing-margin-close"]
    assert "flash" in rows["billing-margin-flash"] and "close" in rows["billing-margin-close"]


def test_never_run_and_long_silent_jobs_are_late_a_recent_success_is_not(finance):
    now = timezone.now()
    JobStatus.objects.create(
        task="billing.budgets_check", entry="billing-budgets-check", last_success_at=now
    )
    JobStatus.objects.create(  # every minute, last success 3 minutes ago
        task="metering.run",
        entry="metering-run",
        last_success_at=now - timedelta(minutes=3),
        last_failure_at=now - timedelta(seconds=20),
        last_error="OperationalError: the database went away",
    )
    JobStatus.objects.create(  # daily, sent without the entry's name: still its row
        task="billing.invoice_daily", last_success_at=now - timedelta(hours=30)
    )

    rows = _rows(finance)
    html = finance.get("/jobs/").content.decode()

    late = set(re.findall(r'<tr data-job="([^"]+)" class="stale"', html))
    assert "billing-budgets-check" not in late
    assert "billing-invoice-daily" not in late  # 30 h < two days
    assert "metering-run" in late
    assert "replicas-scrape" in late and "never" in rows["replicas-scrape"]
    assert "OperationalError: the database went away" in rows["metering-run"]
    assert f"{len(late)} late" in html
    assert now.strftime("%Y-%m-%d %H:%M") in rows["billing-budgets-check"]


def test_next_run_follows_the_schedule_from_the_last_send(finance):
    now = timezone.now()
    every = IntervalSchedule.objects.create(every=15, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.create(
        name="replicas-scrape",
        task="serving.replicas_scrape",
        interval=every,
        last_run_at=now - timedelta(seconds=5),
    )
    PeriodicTask.objects.create(
        name="metering-run", task="metering.run", interval=every, enabled=False
    )

    rows = _rows(finance)

    expected = now + timedelta(seconds=10)
    shown = re.search(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)$", rows["replicas-scrape"]).group(1)
    assert abs((timezone.datetime.fromisoformat(shown + "+00:00") - expected).total_seconds()) < 3
    assert rows["metering-run"].endswith("paused")
    hourly = now.replace(minute=10, second=0, microsecond=0)
    if hourly <= now:
        hourly += timedelta(hours=1)
    assert rows["metering-reconcile"].endswith(hourly.strftime("%Y-%m-%d %H:%M:%S"))


def test_task_outcomes_are_recorded_by_task_and_shown_in_metrics(client):
    before = timezone.now()
    assert budgets_check_task.apply().get() == 0
    failed = margin_report_task.apply(args=[999_999])
    assert failed.failed()

    ok = JobStatus.objects.get(task="billing.budgets_check", entry="")
    assert ok.last_success_at >= before and ok.last_failure_at is None
    bad = JobStatus.objects.get(task="billing.margin_report", entry="")
    assert bad.last_success_at is None and bad.last_failure_at >= before
    assert bad.last_error.startswith("DoesNotExist: MarginReport matching query does not exist")

    success = gauges(client, "gpu_ledger_job_last_success_timestamp_seconds")
    failure = gauges(client, "gpu_ledger_job_last_failure_timestamp_seconds")
    # The only entry of its task: the row recorded without an entry name is its.
    assert success["billing-budgets-check"] == pytest.approx(ok.last_success_at.timestamp())
    assert failure["billing.margin_report"] == pytest.approx(bad.last_failure_at.timestamp())
    assert success["billing.margin_report"] == 0
    assert success["replicas-scrape"] == 0  # never ran
    assert set(BEAT_SCHEDULE) <= set(success)
