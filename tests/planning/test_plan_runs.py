"""Plan runs the way finance uses them: queued from the API or the page,
executed by a real Celery worker (never in the request) with progress,
read back as hourly forecasts with bands through the API and on the Plan
page; bad input is a 400 naming the field, nothing queued."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from billing.choices import RunStatus
from planning import tasks
from planning.models import DemandForecast, PlanRun
from planning.tasks import plan_run_task
from tests.celery_worker import Worker, worker_wait
from tests.conftest import client_for_user
from tests.factories import make_finance_user, make_member, make_tenant
from tests.planning.ledger import ledger_write, weekday_weekend

NOW = datetime(2026, 11, 20, 9, 30, tzinfo=UTC)
RUNS = "/api/v1/plan/runs"


def ledger(weeks: int = 5) -> None:
    """Two pools' model: `shared` at 100 tokens an hour (20 at weekends),
    `reserved` at 50 flat; one request an hour each."""
    ledger_write(
        until=NOW,
        weeks=weeks,
        pools={"shared": weekday_weekend(100, 20), "reserved": lambda hour: 50},
    )


@pytest.fixture
def finance(db):
    return client_for_user(make_finance_user())


@pytest.mark.django_db(transaction=True)
def test_a_run_queued_through_the_api_is_forecast_by_a_worker(tmp_path, monkeypatch):
    ledger()
    finance = client_for_user(make_finance_user())
    worker = Worker("filesystem", tmp_path).start()
    try:
        monkeypatch.setattr(tasks.plan_run_task, "delay", lambda pk: worker.send(plan_run_task, pk))
        queued = finance.post(
            RUNS,
            {"as_of": NOW.isoformat(), "band": "80", "target_margin_percent": "35"},
            format="json",
        )
        assert queued.status_code == 202, queued.json()
        run_id = queued.json()["id"]
        assert queued.json()["status"] == RunStatus.QUEUED

        def done():
            return PlanRun.objects.get(pk=run_id).status in (RunStatus.DONE, RunStatus.FAILED)

        worker_wait(done, worker)
    finally:
        worker.stop()
    run = finance.get(f"{RUNS}/{run_id}").json()
    assert run["status"] == "done", run
    assert (run["series_done"], run["series_total"]) == (2, 2)
    assert (run["band"], run["headroom_percent"], run["target_margin_percent"]) == (
        "80",
        "20.00",
        "35.00",
    )
    pools = finance.get("/api/v1/plan/pools").json()
    # No GPU in either pool, no replica: nothing measured, nothing to size on.
    assert [(p["pool"], p["flags"], p["gpus_held"]) for p in pools] == [
        ("reserved", ["unknown"], "0.000"),
        ("shared", ["unknown"], "0.000"),
    ]
    assert finance.get("/api/v1/plan/capacities").json() == []
    floors = finance.get("/api/v1/plan/floors").json()
    assert [(f["tier"], f["floor"], f["note"]) for f in floors] == [
        ("shared", None, "no price today")
    ]
    forecasts = finance.get("/api/v1/plan/forecasts", {"metric": "tokens"}).json()
    assert [(f["pool"], f["model"]) for f in forecasts] == [
        ("reserved", "tiny"),
        ("shared", "tiny"),
    ]
    reserved = forecasts[0]
    assert reserved["start"] == "2026-11-20T09:00:00Z" and len(reserved["point"]) == 720
    assert all(abs(p - 50) < 0.5 for p in reserved["point"])
    low, high = reserved["bands"]["95"]
    assert len(low) == len(high) == 720 and all(
        lo <= p <= hi for lo, p, hi in zip(low, reserved["point"], high, strict=True)
    )
    assert reserved["method"] in ("ets", "seasonal_naive") and reserved["error"] is not None
    assert DemandForecast.objects.filter(run_id=run_id).count() == 4  # tokens and requests


def test_bad_input_names_its_field_and_queues_nothing(finance, monkeypatch):
    sent = []
    monkeypatch.setattr(tasks.plan_run_task, "delay", sent.append)
    later = finance.post(RUNS, {"as_of": "2999-01-01T00:00:00Z"}, format="json")
    assert later.status_code == 400 and later.json()["error"]["field"] == "as_of"
    garbled = finance.post(RUNS, {"as_of": "monday"}, format="json")
    assert garbled.status_code == 400 and garbled.json()["error"]["field"] == "as_of"
    for field, value in [
        ("band", "99"),
        ("headroom_percent", "-1"),
        ("headroom_percent", "lots"),
        ("target_margin_percent", "100"),
    ]:
        bad = finance.post(RUNS, {field: value}, format="json")
        assert bad.status_code == 400 and bad.json()["error"]["field"] == field, (field, bad.json())
    assert not PlanRun.objects.exists() and sent == []
    none_yet = finance.get("/api/v1/plan/forecasts")
    assert (
        none_yet.status_code == 404
        and "no plan run has finished" in none_yet.json()["error"]["message"]
    )
    for read in ("capacities", "pools", "floors"):
        assert finance.get(f"/api/v1/plan/{read}").status_code == 404
        bad_run = finance.get(f"/api/v1/plan/{read}", {"run": "first"})
        assert bad_run.status_code == 400 and bad_run.json()["error"]["field"] == "run"
    bad_metric = finance.get("/api/v1/plan/forecasts", {"metric": "watts"})
    assert bad_metric.status_code == 400 and bad_metric.json()["error"]["field"] == "metric"
    tenant = make_tenant()
    owner = client_for_user(make_member(tenant).user)
    assert owner.post(RUNS, {}, format="json").status_code == 403
    for read in ("forecasts", "capacities", "pools", "floors"):
        assert owner.get(f"/api/v1/plan/{read}").status_code == 403


def test_the_plan_page_queues_a_run_and_shows_the_forecast(
    finance, monkeypatch, django_capture_on_commit_callbacks
):
    ledger()
    sent = []
    monkeypatch.setattr(tasks.plan_run_task, "delay", sent.append)
    with django_capture_on_commit_callbacks(execute=True):
        queued = finance.post("/finance/plan/")
    assert queued.status_code == 302 and len(sent) == 1
    page = finance.get("/finance/plan/").content.decode()
    assert 'http-equiv="refresh"' in page  # watching a queued run
    PlanRun.objects.filter(pk=sent[0]).update(as_of=NOW)
    plan_run_task(sent[0])
    page = finance.get("/finance/plan/").content.decode()
    assert 'http-equiv="refresh"' not in page
    assert 'data-testid="plan-series"' in page and "shared" in page and "reserved" in page
    assert page.count('<canvas height="70" data-testid="forecast-') == 2
    assert "2 of 2" in page
