"""The jobs page and /metrics: every scheduled job with its schedule in
words, last success, last failure with its error, and next run; a job
whose due slot passed more than its grace ago with no success since is
marked late (never before its first slot); task outcomes are recorded
from Celery's signals by task and beat entry."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask
from django_celery_beat.schedulers import DatabaseScheduler
from prometheus_client.parser import text_string_to_metric_families

from billing.tasks import budgets_check_task, margin_report_task
from config.celery_app import app
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


def _late(html: str) -> set[str]:
    return set(re.findall(r'<tr data-job="([^"]+)" class="late"', html))


def _jobs_section(html: str) -> str:
    return html.split('<section class="card">', 1)[1].split("</section>", 1)[0]


def _beat_loaded(*, ago: dict[str, timedelta] | None = None) -> None:
    """What `celery beat` does as it starts: the database scheduler saves
    every entry of the schedule (nothing sent yet; its own update_from_dict,
    without the scheduler, which closes the test's connection). `ago` moves
    the load of some entries back in time, as if beat started that long ago."""
    for name, entry in app.conf.beat_schedule.items():
        DatabaseScheduler.Entry.from_entry(name, app=app, **entry)
    now = timezone.now()
    for name, span in (ago or {}).items():
        # date_changed is auto_now: only an update() sets it.
        assert PeriodicTask.objects.filter(name=name).update(date_changed=now - span) == 1


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


def test_a_fresh_schedule_is_not_late_before_its_first_slots(finance):
    """Just after beat started, nothing has run and every first slot is
    ahead: nothing is late and nothing is red."""
    _beat_loaded()

    html = finance.get("/jobs/").content.decode()

    assert _late(html) == set()
    jobs = _jobs_section(html)
    assert "late" not in jobs.split("</h2>")[0] and 'class="error"' not in jobs
    assert f"{len(BEAT_SCHEDULE)} jobs</h2>" in jobs
    assert "never" in _rows(finance)["metering-reconcile"]


def test_a_job_that_never_ran_is_late_once_its_first_slot_passed_by_its_grace(finance):
    """Counted from when beat loaded the entry: the first slot after it,
    then the grace (one period, at least a minute, at most an hour)."""
    _beat_loaded(
        ago={
            # every 15 s: first slot 1 min 45 s ago, grace 1 min
            "replicas-scrape": timedelta(minutes=2),
            # every minute: first slot in 30 s
            "metering-run": timedelta(seconds=30),
            # hourly: first slot 30 min ago, still within its hour of grace
            "metering-conservation": timedelta(minutes=90),
            # hourly at :10: its first slot was at least 2 h ago
            "metering-reconcile": timedelta(hours=3, minutes=10),
        }
    )

    html = finance.get("/jobs/").content.decode()

    assert _late(html) == {"replicas-scrape", "metering-reconcile"}
    assert 'data-testid="late-count">2 late</span>' in html
    rows = _rows(finance)
    assert "never" in rows["metering-reconcile"]


def test_a_job_that_ran_is_late_once_its_next_slot_passed_by_its_grace(finance):
    now = timezone.now()
    _beat_loaded()
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
    JobStatus.objects.create(  # every 5 minutes, last success 7 minutes ago: due 2 min ago
        task="billing.stripe_sweep",
        entry="billing-stripe-sweep",
        last_success_at=now - timedelta(minutes=7),
    )
    JobStatus.objects.create(  # daily at 02:00, sent without the entry's name: still its row
        task="billing.invoice_daily", last_success_at=now - timedelta(hours=30)
    )
    # Sent 10 minutes ago (every 5 minutes), failed, never succeeded.
    PeriodicTask.objects.filter(name="billing-runs-abandoned").update(
        last_run_at=now - timedelta(minutes=10)
    )
    JobStatus.objects.create(
        task="billing.runs_abandoned",
        entry="billing-runs-abandoned",
        last_started_at=now - timedelta(minutes=10),
        last_failure_at=now - timedelta(minutes=10),
        last_error="OperationalError: no connection",
    )

    rows = _rows(finance)
    html = finance.get("/jobs/").content.decode()

    assert _late(html) == {"metering-run", "billing-invoice-daily", "billing-runs-abandoned"}
    assert "OperationalError: the database went away" in rows["metering-run"]
    assert f"{len(_late(html))} late" in html
    assert now.strftime("%Y-%m-%d %H:%M") in rows["billing-budgets-check"]


def test_a_paused_job_is_not_late(finance):
    _beat_loaded(ago={"metering-reconcile": timedelta(days=2)})
    PeriodicTask.objects.filter(name="metering-reconcile").update(enabled=False)

    html = finance.get("/jobs/").content.decode()

    assert _late(html) == set()
    assert _rows(finance)["metering-reconcile"].endswith("paused")


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
