"""In a real browser: finance opens the Plan page after a plan run and
sees each pool's and model's forecast drawn: the history, the forecast
and its two bands, as Chart.js has them; "Plan now" queues a run."""

from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from planning import tasks
from planning.models import PlanRun
from planning.runs import plan_run_create, plan_run_execute
from tests.browser.test_enterprise import PASSWORD, sign_in
from tests.factories import make_finance_user
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
