"""In a real browser: finance staff and a tenant sign in, the charts are
drawn (a canvas with pixels on it), finance issues a credit note, a
tenant's owner creates and revokes a key and downloads an export; a
viewer cannot create keys. Screenshots are kept as test artifacts."""

from __future__ import annotations

import csv
import io
import time

from django.conf import settings
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from billing.models import CreditNote, Invoice
from tenants.models import ApiKey
from tests.conftest import client_for_key

# True once Chart.js has drawn something: some pixel is not transparent.
DRAWN = """
const canvas = document.querySelector(arguments[0]);
if (!canvas || !window.Chart || !Chart.getChart(canvas)) return false;
const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
for (let i = 3; i < pixels.length; i += 4) if (pixels[i] > 0) return true;
return false;
"""

# One column of a table's body, top to bottom.
COLUMN = """
const rows = document.querySelector(`[data-testid=${arguments[0]}] tbody`).rows;
return Array.from(rows, (row) => row.cells[arguments[1]].textContent.trim());
"""


def sign_in(browser, live_server, username: str) -> None:
    browser.get(f"{live_server.url}/login/")
    browser.find_element(By.NAME, "username").send_keys(username)
    browser.find_element(By.NAME, "password").send_keys(settings.DEMO_PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    WebDriverWait(browser, 10).until(
        ec.text_to_be_present_in_element((By.CSS_SELECTOR, "[data-testid=signed-in-as]"), username)
    )


def chart_drawn(browser, selector: str) -> bool:
    try:
        WebDriverWait(browser, 10).until(lambda b: b.execute_script(DRAWN, selector))
    except TimeoutException:  # reported by the caller's assertion
        return False
    return True


def test_finance_sees_charts_and_issues_a_credit_note(browser, live_server, demo_world, shots):
    sign_in(browser, live_server, "finance")

    browser.get(f"{live_server.url}/finance/")
    assert chart_drawn(browser, "canvas[data-testid=tier-chart]")
    tiers = browser.find_element(By.CSS_SELECTOR, "[data-testid=by-tier]").text
    assert "shared" in tiers and "dedicated" in tiers
    shots(browser, "finance")
    # In the reporting currency (the column before is "as billed", per currency).
    revenue = browser.find_element(
        By.XPATH, "//table[@data-testid='by-tenant']//th[.='Revenue, USD']"
    )
    for order in (sorted, lambda xs: sorted(xs, reverse=True)):  # a click sorts, another reverses
        revenue.click()
        column = [float(v.replace(",", "")) for v in browser.execute_script(COLUMN, "by-tenant", 2)]
        assert len(column) > 3 and column == order(column)
    # Tokens are shown grouped ("2,142,680,504") and still sort as numbers.
    browser.find_element(By.XPATH, "//table[@data-testid='by-tenant']//th[.='Tokens']").click()
    tokens = browser.execute_script(COLUMN, "by-tenant", 6)
    assert any("," in t for t in tokens)
    counts = [int(t.replace(",", "")) for t in tokens]
    assert counts == sorted(counts)

    browser.find_element(By.CSS_SELECTOR, "[data-testid=model-link]").click()  # a model
    WebDriverWait(browser, 10).until(ec.url_contains("/finance/models/"))
    heaviest = browser.find_element(By.CSS_SELECTOR, "[data-testid=model-tenants]").text
    assert "hooli" in heaviest and "acme" in heaviest
    shots(browser, "finance-model")
    browser.find_element(By.LINK_TEXT, "hooli").click()  # drill into a tenant
    WebDriverWait(browser, 10).until(ec.url_contains("/finance/tenants/hooli/"))
    assert chart_drawn(browser, "canvas[data-testid=usage-chart]")
    assert "Margin" in browser.find_element(By.CSS_SELECTOR, "[data-testid=tenant-margin]").text
    shots(browser, "finance-tenant")

    browser.get(f"{live_server.url}/costs/?days=30")
    assert chart_drawn(browser, "canvas[data-testid=utilization-chart]")
    shots(browser, "costs")

    browser.get(f"{live_server.url}/fleet/")
    assert "vllm-shared" in browser.find_element(By.CSS_SELECTOR, "[data-testid=replicas]").text
    shots(browser, "fleet")

    invoice = Invoice.objects.filter(status="finalized", currency="USD").order_by("pk").first()
    browser.get(f"{live_server.url}/invoices/{invoice.pk}/")
    form = browser.find_element(By.CSS_SELECTOR, "[data-testid=credit-note-form]")
    form.find_element(By.NAME, "amount").send_keys("2.50")
    form.find_element(By.NAME, "reason").send_keys("latency SLA missed")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    message = WebDriverWait(browser, 10).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, "[data-testid=message]"))
    )
    assert "Credit note CN-" in message.text
    assert CreditNote.objects.get(invoice=invoice).amount_minor == 250
    shots(browser, "invoice-credited")


def test_a_tenant_owner_sees_usage_manages_keys_and_downloads_an_export(
    browser, live_server, demo_world, shots
):
    sign_in(browser, live_server, "hooli-owner")

    browser.get(f"{live_server.url}/usage/")
    assert chart_drawn(browser, "canvas[data-testid=usage-chart]")
    totals = browser.find_element(By.CSS_SELECTOR, "[data-testid=usage-totals]").text
    assert "Tokens" in totals or "tokens" in totals
    shots(browser, "usage")

    browser.find_element(By.CSS_SELECTOR, "[data-testid=export-csv]").click()
    deadline = time.monotonic() + 20
    csvs = []
    while time.monotonic() < deadline and not csvs:
        csvs = [p for p in browser.downloads.iterdir() if p.suffix == ".csv"]
        time.sleep(0.2)
    assert csvs, list(browser.downloads.iterdir())
    rows = list(csv.DictReader(io.StringIO(csvs[0].read_text())))
    assert len(rows) > 10  # day by day over the month
    assert {row["tenant"] for row in rows} == {"hooli"}  # its own usage only
    assert sum(int(row["completion_tokens"]) for row in rows) > 0

    browser.get(f"{live_server.url}/keys/")
    form = browser.find_element(By.CSS_SELECTOR, "[data-testid=create-key]")
    form.find_element(By.NAME, "name").send_keys("browser test key")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    secret = (
        WebDriverWait(browser, 10)
        .until(ec.presence_of_element_located((By.CSS_SELECTOR, "[data-testid=secret]")))
        .text
    )
    key = ApiKey.objects.get(name="browser test key")
    assert key.prefix in secret and key.tenant.slug == "hooli"
    assert client_for_key(secret).get("/api/v1/tenants/me").status_code == 200
    shots(browser, "key-created")
    assert browser.current_url == f"{live_server.url}/keys/"  # redirected after the POST
    browser.refresh()  # a GET: submits nothing again
    assert secret not in browser.page_source  # shown once
    assert ApiKey.objects.filter(name="browser test key").count() == 1
    browser.find_element(By.CSS_SELECTOR, f"[data-testid=revoke-{key.pk}]").click()
    WebDriverWait(browser, 10).until(
        lambda b: not b.find_elements(By.CSS_SELECTOR, f"[data-testid=revoke-{key.pk}]")
    )
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert client_for_key(secret).get("/api/v1/tenants/me").status_code == 401
    shots(browser, "key-revoked")


def test_a_viewer_sees_the_usage_chart_but_no_key_form(browser, live_server, demo_world, shots):
    sign_in(browser, live_server, "acme-viewer")
    browser.get(f"{live_server.url}/usage/")
    assert chart_drawn(browser, "canvas[data-testid=usage-chart]")
    browser.get(f"{live_server.url}/keys/")
    assert not browser.find_elements(By.CSS_SELECTOR, "[data-testid=create-key]")
    assert "Only the tenant's owners and admins" in browser.page_source
    browser.get(f"{live_server.url}/finance/")
    assert "You cannot open this page" in browser.page_source  # the 403 page, in the layout
    assert not browser.find_elements(By.CSS_SELECTOR, "canvas[data-testid=tier-chart]")
    browser.find_element(By.CSS_SELECTOR, "[data-testid=back-home]").click()
    WebDriverWait(browser, 10).until(lambda b: b.current_url == f"{live_server.url}/")
    shots(browser, "viewer")
