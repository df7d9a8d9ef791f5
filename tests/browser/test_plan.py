"""In a real browser: finance opens the Plan page after a plan run and
sees each pool's and model's forecast drawn: the history, the forecast
and its two bands, as Chart.js has them; "Plan now" queues a run."""

from __future__ import annotations

from decimal import Decimal

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from billing.models import SloPolicy
from planning import tasks
from planning.models import PlanRun
from planning.runs import plan_run_create, plan_run_execute
from tests.billing.conftest import make_world
from tests.browser.test_enterprise import PASSWORD, sign_in
from tests.factories import make_finance_user
from tests.planning.fleet import NOW as FLEET_NOW
from tests.planning.fleet import demand_write, load_write, shared_fleet
from tests.planning.test_plan_runs import NOW, ledger


@pytest.fixture
def planned(transactional_db, monkeypatch):
    finance = make_finance_user(username="fran")
    finance.set_password(PASSWORD)
    finance.save()
    ledger()
    plan_run_execute(run_id=plan_run_create(as_of=NOW).pk)
    monkeypatch.setattr(tasks.plan_run_task, "delay", lambda pk: None)


def test_the_plan_page_draws_each_forecast_with_its_bands(browser, live_server, planned, shots):
    sign_in(browser, live_server, "fran")
    browser.get(f"{live_server.url}/finance/plan/")
    WebDriverWait(browser, 10).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, "[data-testid=plan-series]"))
    )
    canvases = browser.find_elements(By.CSS_SELECTOR, "canvas[data-testid^=forecast-]")
    assert len(canvases) == 2
    drawn = browser.execute_script(
        "return Array.from(arguments[0]).map(c => { const chart = Chart.getChart(c);"
        " return chart && [chart.data.datasets.length, chart.data.labels.length, c.width]; })",
        canvases,
    )
    assert all(d is not None and d[0] == 6 and d[1] == 14 * 24 + 720 and d[2] > 0 for d in drawn)
    rows = browser.find_elements(By.CSS_SELECTOR, "[data-testid=plan-series] tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[0].text for r in rows] == ["reserved", "shared"]
    shots(browser, "plan")

    browser.find_element(By.CSS_SELECTOR, "[data-testid=plan-run-form] button").click()
    WebDriverWait(browser, 10).until(lambda b: PlanRun.objects.count() == 2)
    assert PlanRun.objects.order_by("-pk").first().status == "queued"


@pytest.fixture
def sized(transactional_db, monkeypatch):
    """The costed shared pool of tests.planning.fleet, its demand doubled
    in the last two weeks, planned on the point forecast."""
    finance = make_finance_user(username="fran")
    finance.set_password(PASSWORD)
    finance.save()
    world = make_world()
    SloPolicy.objects.create(
        name="Shared default", tier="shared", ttft_p95_ms=Decimal(2000), itl_p95_ms=Decimal(250)
    )
    _pool, replica = shared_fleet(world)
    world.price(tier="shared")
    load_write(replica)
    demand_write(
        world,
        replica,
        weeks=6,
        tokens=lambda h: 200_000 if h < 4 * 168 else 400_000,
        seconds_per_token=0.005,
    )
    plan_run_execute(run_id=plan_run_create(as_of=FLEET_NOW, band="point").pk)
    monkeypatch.setattr(tasks.plan_run_task, "delay", lambda pk: None)


def chart_shape(browser, selector: str) -> list:
    canvases = browser.find_elements(By.CSS_SELECTOR, selector)
    return browser.execute_script(
        "return Array.from(arguments[0]).map(c => { const chart = Chart.getChart(c);"
        " return chart && [chart.data.datasets.length, chart.data.labels.length, c.width]; })",
        canvases,
    )


def test_the_plan_page_shows_gpus_needed_floors_and_the_latency_curve(
    browser, live_server, sized, shots
):
    sign_in(browser, live_server, "fran")
    browser.get(f"{live_server.url}/finance/plan/")
    WebDriverWait(browser, 10).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, "[data-testid=plan-pools]"))
    )
    flag = browser.find_element(By.CSS_SELECTOR, "[data-testid=flag-shared]")
    assert flag.text == "under"
    cells = [
        td.text
        for td in browser.find_elements(By.CSS_SELECTOR, "[data-testid=plan-pools] tbody td")
    ]
    assert cells[:4] == ["shared", "shared", "1", "2"]  # held 1, needs 2
    floors = browser.find_element(By.CSS_SELECTOR, "[data-testid=plan-floors]").text
    assert "input" in floors and "output" in floors and "today's prices x" in floors
    # The curve: TTFT and inter-token p95 and their two targets, 8 bins.
    drawn = chart_shape(browser, "canvas[data-testid^=capacity-]")
    assert len(drawn) == 1 and drawn[0][:2] == [4, 8] and drawn[0][2] > 0
    shots(browser, "plan-sizing")

    form = browser.find_element(By.CSS_SELECTOR, "[data-testid=plan-run-form]")
    margin = form.find_element(By.NAME, "target_margin_percent")
    margin.clear()
    margin.send_keys("lots")
    form.find_element(By.TAG_NAME, "button").click()
    WebDriverWait(browser, 10).until(
        ec.text_to_be_present_in_element((By.CSS_SELECTOR, "ul.messages"), "target_margin_percent")
    )
    assert PlanRun.objects.count() == 1  # nothing queued

    browser.get(f"{live_server.url}/fleet/")
    drawn = chart_shape(browser, "canvas[data-testid^=capacity-]")
    assert len(drawn) == 1 and drawn[0][:2] == [4, 8] and drawn[0][2] > 0
