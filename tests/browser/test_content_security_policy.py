"""In a real browser, under the Content-Security-Policy (core.csp): no page
finance staff, a tenant's owner or a superuser in the admin opens reports a
violation, and what the pages' scripts do still happens (charts drawn, the
finance table built, Swagger UI rendered). A violation is what the browser
refused: a script, a style or a handler the policy does not allow."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from billing.models import Invoice
from tests.browser.test_dashboards import chart_drawn, sign_in
from tests.dashboard import test_content_security_policy as csp_pages

# Run before any of a page's own scripts (DevTools adds it to every
# document, outside the page's policy): the page's violations, kept.
WATCH = """
window.cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => window.cspViolations.push(
  `${e.effectiveDirective} refused ${e.blockedURI || "inline"}`
  + ` at ${e.sourceFile}:${e.lineNumber}`));
"""
# The pages the policy test reads as HTML, those a browser can reach here
# by name (an invoice's pages are opened below, by the demo's invoice).
FINANCE_PAGES = [
    p.format(slug="acme")
    for p in csp_pages.FINANCE_PAGES
    if not any(part in p for part in ("{invoice}", "{draft}", "/models/"))
]
OWNER_PAGES = [p for p in csp_pages.OWNER_PAGES if "{" not in p]
ADMIN_PAGES = [
    "/admin/",
    "/admin/billing/pricebook/",
    "/admin/billing/pricebook/add/",
    "/admin/tenants/tenant/",
]


@pytest.fixture
def watched(browser):
    browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH})
    return browser


def _violations(browser, live_server, path: str) -> list[str]:
    browser.get(f"{live_server.url}{path}")
    WebDriverWait(browser, 10).until(
        lambda b: b.execute_script("return document.readyState") == "complete"
    )
    time.sleep(0.3)  # a report is sent after the refusal, as a task of its own
    return [f"{path}: {v}" for v in browser.execute_script("return window.cspViolations")]


def test_finance_and_owner_pages_run_under_the_policy(watched, live_server, demo_world):
    browser = watched
    sign_in(browser, live_server, "finance")
    refused = [v for path in FINANCE_PAGES for v in _violations(browser, live_server, path)]
    browser.get(f"{live_server.url}/finance/")
    assert chart_drawn(browser, "canvas[data-testid=tier-chart]")  # the nonce'd scripts ran
    assert browser.find_elements(By.CSS_SELECTOR, "[data-testid=tenant-link]")
    invoice = Invoice.objects.exclude(status="draft").order_by("pk").first()
    refused += _violations(browser, live_server, f"/invoices/{invoice.pk}/")
    # Its buttons' handlers are attached by its script, not inline ones.
    browser.execute_script("window.print = () => { window.printed = true; };")
    browser.find_element(By.CSS_SELECTOR, "[data-print]").click()
    assert browser.execute_script("return window.printed") is True
    browser.delete_all_cookies()

    sign_in(browser, live_server, "hooli-owner")
    refused += [v for path in OWNER_PAGES for v in _violations(browser, live_server, path)]
    browser.get(f"{live_server.url}/usage/")
    assert chart_drawn(browser, "canvas[data-testid=usage-chart]")
    assert refused == [], "\n".join(refused)


def test_the_admin_and_the_api_docs_run_under_the_policy(watched, live_server, transactional_db):
    browser = watched
    get_user_model().objects.create_superuser("root", "root@example.com", settings.DEMO_PASSWORD)
    browser.get(f"{live_server.url}/admin/login/")
    browser.find_element(By.NAME, "username").send_keys("root")
    browser.find_element(By.NAME, "password").send_keys(settings.DEMO_PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(browser, 10).until(ec.presence_of_element_located((By.ID, "user-tools")))
    refused = [v for path in ADMIN_PAGES for v in _violations(browser, live_server, path)]
    refused += _violations(browser, live_server, "/api/docs/")
    WebDriverWait(browser, 20).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, ".swagger-ui .opblock"))
    )
    refused += browser.execute_script("return window.cspViolations")  # once drawn, too
    refused += _violations(browser, live_server, "/api/redoc/")
    WebDriverWait(browser, 20).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, ".redoc-wrap .api-content"))
    )
    refused += browser.execute_script("return window.cspViolations")
    assert refused == [], "\n".join(refused)
