"""The scheduled jobs as finance sees them: every entry of the beat schedule
with its schedule in words, last success, last failure (with the error)
and next run, marked late once a run it was due for has not succeeded
within its grace; and the same last-success and last-failure times as
Prometheus gauges, read from the database at each scrape."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from celery.schedules import BaseSchedule, crontab, schedule
from django.shortcuts import render
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily

from config.celery_app import app
from config.schedule import BEAT_SCHEDULE
from core.jobs import beat_entry_list, job_status_list, job_status_list_except
from core.models import JobStatus
from tenants.access import finance_staff_required

DAYS = {
    "0": "Sundays",
    "1": "Mondays",
    "2": "Tuesdays",
    "3": "Wednesdays",
    "4": "Thursdays",
    "5": "Fridays",
    "6": "Saturdays",
    "7": "Sundays",
    "sun": "Sundays",
    "mon": "Mondays",
    "tue": "Tuesdays",
    "wed": "Wednesdays",
    "thu": "Thursdays",
    "fri": "Fridays",
    "sat": "Saturdays",
}

# How long past a due slot a job may still be running or queued behind
# another before it is late: one period, but at least a minute (a busy
# worker holds back a 15-second job) and at most an hour (a daily job
# that missed its slot is news the same morning, not two days later).
GRACE_MIN = timedelta(minutes=1)
GRACE_MAX = timedelta(hours=1)


@dataclass
class Job:
    """One beat entry and how it last ran."""

    name: str
    task: str
    args: tuple
    schedule: BaseSchedule
    enabled: bool
    last_run_at: datetime | None  # when beat last sent it
    status: JobStatus | None
    # When beat last loaded the entry (each beat start saves it again), or
    # an operator changed it: what beat counts a first send from.
    scheduled_since: datetime | None = None

    @property
    def last_success_at(self) -> datetime | None:
        return self.status.last_success_at if self.status else None

    @property
    def last_failure_at(self) -> datetime | None:
        return self.status.last_failure_at if self.status else None

    @property
    def last_error(self) -> str:
        return self.status.last_error if self.status and self.status.last_failure_at else ""

    @property
    def in_words(self) -> str:
        return schedule_in_words(self.schedule)

    @property
    def last_started_at(self) -> datetime | None:
        return self.status.last_started_at if self.status else None

    def next_run_at(self, now: datetime) -> datetime:
        """When beat sends it next: the schedule's next time after the last
        send (never sent: after beat loaded it); a run overdue is due now."""
        last = self.last_run_at or self.last_started_at or self.scheduled_since
        return max(now, _next_after(self.schedule, last or now))

    def period(self, now: datetime) -> timedelta:
        """The time between two runs (for a cron schedule: the two next)."""
        first = _next_after(self.schedule, now)
        return _next_after(self.schedule, first) - first

    def grace(self, now: datetime) -> timedelta:
        return min(max(self.period(now), GRACE_MIN), GRACE_MAX)

    def due_at(self) -> datetime | None:
        """The slot by which it should have succeeded again: the schedule's
        next slot after its last success. Never succeeded: its first slot
        after beat loaded the entry (beat counts from there too, so a job
        whose first slot is still ahead is not due), or when beat sent it or
        a worker started it, if earlier. None: beat has not loaded it."""
        if self.last_success_at:
            return _next_after(self.schedule, self.last_success_at)
        due = [moment for moment in (self.last_run_at, self.last_started_at) if moment]
        if self.scheduled_since:
            due.append(_next_after(self.schedule, self.scheduled_since))
        return min(due, default=None)

    def late(self, now: datetime) -> bool:
        """Enabled, and a slot it was due at passed more than its grace ago
        without a success since."""
        due = self.due_at()
        return self.enabled and due is not None and now - due > self.grace(now)


def jobs_list() -> list[Job]:
    """Every beat entry, as beat runs it: the database scheduler's row when
    there is one (operators may retime or pause it), else the declaration
    in config/schedule.py."""
    rows = {p.name: p for p in beat_entry_list(names=list(BEAT_SCHEDULE))}
    tasks = {spec["task"] for spec in BEAT_SCHEDULE.values()}
    statuses = {(s.task, s.entry): s for s in job_status_list(tasks=tasks)}
    entries_per_task = {t: sum(s["task"] == t for s in BEAT_SCHEDULE.values()) for t in tasks}
    jobs = []
    for name, spec in BEAT_SCHEDULE.items():
        row = rows.get(name)
        status = statuses.get((spec["task"], name))
        if status is None and entries_per_task[spec["task"]] == 1:
            # Sent without the entry's name (celery's own beat, by hand).
            status = statuses.get((spec["task"], ""))
        jobs.append(
            Job(
                name=name,
                task=spec["task"],
                args=tuple(spec.get("args", ())),
                schedule=row.schedule if row else _as_schedule(spec["schedule"]),
                enabled=row.enabled if row else True,
                last_run_at=row.last_run_at if row else None,
                status=status,
                scheduled_since=row.date_changed if row else None,
            )
        )
    return jobs


def schedule_in_words(every) -> str:
    if isinstance(every, crontab):
        return _crontab_in_words(every)
    seconds = int(every.run_every.total_seconds())
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0 and seconds >= size:
            count = seconds // size
            return f"every {unit}" if count == 1 else f"every {count} {unit}s"
    return f"every {seconds} s"


def _crontab_in_words(cron: crontab) -> str:
    minute, hour = str(cron._orig_minute), str(cron._orig_hour)
    dow, dom, month = (
        str(cron._orig_day_of_week),
        str(cron._orig_day_of_month),
        str(cron._orig_month_of_year),
    )
    if not (minute.isdigit() and month == "*"):
        return f"cron {minute} {hour} {dom} {month} {dow} (UTC)"
    if hour == "*" and dow == "*" and dom == "*":
        return f"hourly at :{int(minute):02d}"
    if not hour.isdigit():
        return f"cron {minute} {hour} {dom} {month} {dow} (UTC)"
    at = f"{int(hour):02d}:{int(minute):02d} UTC"
    if dow == "*" and dom == "*":
        return f"daily at {at}"
    if dom == "*" and dow.lower() in DAYS:
        return f"{DAYS[dow.lower()]} at {at}"
    if dow == "*" and dom.isdigit():
        return f"monthly on day {int(dom)} at {at}"
    return f"cron {minute} {hour} {dom} {month} {dow} (UTC)"


def _duration_in_words(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def _as_schedule(every) -> BaseSchedule:
    if isinstance(every, BaseSchedule):
        return every
    seconds = every.total_seconds() if isinstance(every, timedelta) else float(every)
    return schedule(run_every=timedelta(seconds=seconds), app=app)


def _next_after(every, moment: datetime) -> datetime:
    if isinstance(every, crontab):
        start, ffwd, _ = every.remaining_delta(moment)
        return start + ffwd
    return moment + every.run_every


@finance_staff_required
def jobs_page(request):
    now = timezone.now()
    jobs = jobs_list()
    rows = [
        {
            "job": job,
            "next_run_at": job.next_run_at(now),
            "due_at": job.due_at(),
            "grace_in_words": _duration_in_words(job.grace(now)),
            "late": job.late(now),
        }
        for job in jobs
    ]
    return render(
        request,
        "dashboard/jobs.html",
        {"rows": rows, "now": now, "late_count": sum(r["late"] for r in rows)},
    )


class JobsCollector:
    """gpu_ledger_job_last_success_timestamp_seconds and
    ..._last_failure_timestamp_seconds per job (the beat entry's name, or
    the task's for a job beat did not send), 0 when it never happened. Read
    from the database at scrape time: no state in the process."""

    def collect(self):
        success = GaugeMetricFamily(
            "gpu_ledger_job_last_success_timestamp_seconds",
            "When the job last finished without error (Unix time; 0: never).",
            labels=["job", "task"],
        )
        failure = GaugeMetricFamily(
            "gpu_ledger_job_last_failure_timestamp_seconds",
            "When the job last failed (Unix time; 0: never).",
            labels=["job", "task"],
        )
        shown = set()
        for job in jobs_list():
            if job.status:
                shown.add(job.status.pk)
            labels = [job.name, job.task]
            success.add_metric(labels, _timestamp(job.last_success_at))
            failure.add_metric(labels, _timestamp(job.last_failure_at))
        for status in job_status_list_except(ids=shown):
            labels = [status.entry or status.task, status.task]
            success.add_metric(labels, _timestamp(status.last_success_at))
            failure.add_metric(labels, _timestamp(status.last_failure_at))
        yield success
        yield failure


def _timestamp(moment: datetime | None) -> float:
    return moment.timestamp() if moment else 0.0
